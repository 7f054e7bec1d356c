"""What an environment detector (``@pitfall.env``) receives: `EnvFacts`, collected once per run."""

from torchdoctor.env.facts import EnvFacts, GpuProcess, LibraryCopy, PathEntry, RankFacts, UnmetRequirement
from torchdoctor.env.shadowing import THIRD_PARTY

__all__ = ["EnvFacts", "GpuProcess", "LibraryCopy", "PathEntry", "RankFacts", "THIRD_PARTY", "UnmetRequirement"]
