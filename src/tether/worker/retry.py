"""How long a failed attempt waits before the next one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta


@dataclass
class RetryPolicy:
    """Exponential backoff with equal jitter: attempt n waits between half and all of
    ``base * 2**(n-1)``, capped at ``cap`` seconds. Jitter keeps retries of many jobs that failed
    together (an outage) from returning together."""

    base: float = 2.0
    cap: float = 3600.0
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def delay(self, attempt: int) -> timedelta:
        full = min(self.cap, self.base * 2 ** min(max(0, attempt - 1), 60))
        return timedelta(seconds=full / 2 + self.rng.uniform(0, full / 2))
