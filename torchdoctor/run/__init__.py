"""`torchdoctor run`: a script or module run as Python would run it, with the runtime doctor attached.

`run_script` (in `torchdoctor.run.doctor`) is what the command does, callable in-process.
"""
