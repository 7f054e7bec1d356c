"""`torchdoctor env`: fact collectors (no torch import in this process) and the environment doctor."""
