"""Run one front door in this process on inputs that need no probe, and print the modules it imported (torchdoctor's,
and the others it loaded beyond what the command line and the env door's test stub had loaded).

`python tests/door_imports.py env --select module-shadowing` (tests/test_door_imports.py runs it per door).
"""

import json
import sys
from pathlib import Path

from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str]) -> None:
    from env_stub import collection_of

    from torchdoctor.cli import cli
    from torchdoctor.env import doctor
    from torchdoctor.env.facts import EnvFacts

    doctor.FactCollection = collection_of(EnvFacts)  # env runs on empty facts: no probe subprocess
    preloaded = set(sys.modules)
    before = {m for m in sys.modules if m.startswith("torchdoctor")}
    result = CliRunner().invoke(cli, argv)
    imported = sorted(m for m in sys.modules if m.startswith("torchdoctor") and m not in before)
    others = sorted(m for m in sys.modules if not m.startswith("torchdoctor") and m not in preloaded)
    print(
        json.dumps(
            {
                "exit_code": result.exit_code,
                "output": result.output,
                "imported": imported,
                "others": others,
                "torch": "torch" in sys.modules,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
