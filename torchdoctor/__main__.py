"""`python -m torchdoctor` behaves like the `torchdoctor` console script."""

from torchdoctor.cli import main

if __name__ == "__main__":
    main()
