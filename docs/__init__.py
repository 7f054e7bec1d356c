"""Docs pages shipped with torchdoctor: one Markdown page per check under `checks/`."""
