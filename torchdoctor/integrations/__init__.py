"""Thin adapters that run `torchdoctor.watch` inside training frameworks; each imports its framework, so
import the one you use: `torchdoctor.integrations.lightning`, `torchdoctor.integrations.transformers`.
accelerate needs no adapter: pass what ``Accelerator.prepare`` returns to `torchdoctor.watch`."""
