"""Count-in-window escalation of Xid codes (pure): a site's ``[xid]`` entry with ``count`` and
``window`` (``31 = { severity = "critical", action = "reset_gpu", count = 3, window = 600 }``)
applies to a GPU's code only once ``count`` of its records fell within ``window`` seconds, as
aws/eks-node-monitoring-agent#272 and NVIDIA/NVSentinel#271 ask ("3 within 10 minutes" of an
Xid 31 on the same GPU).  Below that the catalog's meaning holds.

:func:`burst` is the rule; :class:`Bursts` holds, for the codes whose entry has a count, each
GPU's latest records' times and when the count was reached.  Records of another GPU or another
code never count together; an operator's clear of the GPU's Xids starts its counts again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from gpuagent.configkeys import MAX_XID_COUNT, Override

__all__ = ["Bursts", "Rule", "burst", "rules"]

# An entry's count and window (s).
Rule = tuple[int, float]


def burst(times: Sequence[float], count: int, window: float) -> int | None:
    """The index in ``times`` (one GPU's records of one code, s, in journal order) of the
    record that first made ``count`` consecutive records span at most ``window`` s, or
    ``None``.  The span is the latest minus the earliest of them, so a clock stepped back
    between records neither makes nor hides a burst."""
    for end in range(count - 1, len(times)):
        last = times[end - count + 1 : end + 1]
        if max(last) - min(last) <= window:
            return end
    return None


def rules(table: Mapping[int, Override]) -> dict[int, Rule]:
    """The entries of a site's ``[xid]`` table that have a count, by code."""
    return {
        code: (entry.repeats, entry.window)
        for code, entry in table.items()
        if entry.repeats is not None and entry.window is not None
    }


class Bursts:
    """Whether each (device, code) reached its entry's count within its window this boot.

    Feed it every counted record with :meth:`add`, clears with :meth:`clear`, in journal
    order.  Only the codes of :attr:`rules` are held, each (device, code) with its latest
    :data:`gpuagent.configkeys.MAX_XID_COUNT` times: bounded by the table, whatever a flood
    brings.  Once reached, a (device, code) stays so until a clear or the next boot."""

    def __init__(self, table: Mapping[int, Override] | None = None) -> None:
        self._rules = rules(table or {})
        self._times: dict[tuple[str, int], deque[float]] = {}
        self._reached: dict[tuple[str, int], float] = {}

    @property
    def rules(self) -> Mapping[int, Rule]:
        """The count and window of each code that has them."""
        return self._rules

    def reload(self, table: Mapping[int, Override]) -> None:
        """Follow a new ``[xid]`` table: a code whose count or window changed is judged again
        on the records held; a code newly given one counts from now on."""
        new = rules(table)
        for key in list(self._times):
            rule = new.get(key[1])
            if rule is None:
                del self._times[key]
                self._reached.pop(key, None)
            elif rule != self._rules.get(key[1]):
                self._reached.pop(key, None)
                self._judge(key, rule, whole=True)
        self._rules = new

    def add(self, device: str, code: int, time: float) -> None:
        """One record of ``code`` on ``device`` at ``time`` (s since the epoch)."""
        rule = self._rules.get(code)
        if rule is None:
            return
        key = (device, code)
        times = self._times.get(key)
        if times is None:
            times = self._times[key] = deque(maxlen=MAX_XID_COUNT)
        times.append(time)
        if key not in self._reached:
            self._judge(key, rule, whole=False)

    def _judge(self, key: tuple[str, int], rule: Rule, whole: bool) -> None:
        times = list(self._times[key])
        # A record added needs only the latest ``count`` looked at; a new rule all held.
        seen = times if whole else times[-rule[0] :]
        end = burst(seen, *rule)
        if end is not None:
            self._reached[key] = seen[end]

    def clear(self, device: str) -> None:
        """An operator cleared ``device``'s Xids: its counts start again."""
        for key in [k for k in self._times if k[0] == device]:
            del self._times[key]
            self._reached.pop(key, None)

    def entry(self, table: Mapping[int, Override], device: str, code: int) -> Override | None:
        """``table``'s entry for ``device``'s ``code`` as it applies now: ``None`` where there
        is none, or its count was not reached within its window."""
        site = table.get(code)
        if site is None or site.repeats is None or self.reached(device, code) is not None:
            return site
        return None

    def reached(self, device: str, code: int) -> float | None:
        """When (the record's time, s) ``device``'s ``code`` reached its count within its
        window, or ``None``: not (yet), or no count for the code."""
        return self._reached.get((device, code))
