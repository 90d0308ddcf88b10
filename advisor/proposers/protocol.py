"""The one protocol every proposer implements, and the chain the tune loop asks.

A proposer looks at the study's ledger (our rows, ``advisor.proposers.ledger``) and either proposes the next
candidate or passes (None: not its turn, or nothing to offer). The loop asks an ordered chain — the first proposer
that proposes wins — as Ray Tune asks its ``Searcher`` and Ax its generation strategy. A proposal without
parameters leaves the draw to the study's Optuna sampler (which learns from every trial it is told). A proposer
that finds the space used up raises ``Exhausted``: the study ends saying why.

Adding a proposer is one class with a ``name`` and ``propose``, put in the chain (``tests/test_proposer_protocol.py``
plugs one in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from advisor.proposers.ledger import Ledger
from advisor.proposers.names import SAMPLER

Params = dict[str, Any]


@dataclass(frozen=True)
class Proposal:
    """The next candidate's parameters (None: the study's sampler draws it) and who proposed it, as its row says."""

    params: Params | None
    proposer: str


class Exhausted(Exception):
    """Nothing is left to propose: the study stops with this message. ``exhausted``: the whole valid space is
    measured (not merely a grid pass or a stalled draw)."""

    def __init__(self, why: str, *, exhausted: bool = True) -> None:
        super().__init__(why)
        self.exhausted = exhausted


class Proposer(Protocol):
    name: str

    def propose(self, ledger: Ledger) -> Proposal | None:
        """The next candidate, or None to pass to the next proposer in the chain."""
        ...


class Sampler:
    """The study's own Optuna sampler (steered onto the valid space): always proposes, so it ends a chain."""

    name = SAMPLER

    def propose(self, ledger: Ledger) -> Proposal:
        return Proposal(None, self.name)


def next_proposal(chain: Sequence[Proposer], ledger: Ledger) -> Proposal:
    """The first proposal of ``chain``, asked in order; the sampler's draw when every proposer passes."""
    for proposer in chain:
        if (proposal := proposer.propose(ledger)) is not None:
            return proposal
    return Sampler().propose(ledger)
