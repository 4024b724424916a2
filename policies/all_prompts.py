"""`all` (the default selection policy): every planned prompt is rolled out, one advantage
group per invocation — the behaviour `policies.base.Selection` defines."""

from __future__ import annotations

from policies.base import SELECTIONS, Selection

SELECTIONS.add("all", Selection)
