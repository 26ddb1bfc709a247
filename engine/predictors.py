"""Output-buffer preallocation policies behind one decision API.

Every policy implements ``realloc(buf, id, shape, dtype_bits, used_bytes) -> ReallocDecision``
(the entry point ``BufferState.realloc_if_needed`` calls), so the engine and
``dyncli predictor-sim`` run the same code:

* ``openvino`` - the GPU plugin's ShapePredictor (engine/shape_predictor.py,
  memory_preallocation.md);
* ``none``     - the same realloc_if_needed with preallocation off ("0 0 0 1.0"): exact sizes;
* ``adaptive`` - :class:`AdaptivePredictor`, online like a runtime, but with a horizon that
  grows while its predictions hold, steps of any size, and memory kept across resets;
* ``oracle``   - :class:`OraclePredictor`, sees the whole future; simulator only.
"""
from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass

from engine.shape_predictor import (RECLAIM_FACTOR, BufferState, PreallocSettings, ReallocDecision,
                                    ShapePredictor, _bytes_for, _shape_size, can_preallocate)

# name -> one-line description; ENGINE_POLICIES are the ones `dyncli run --predictor` takes
POLICIES = {
    "openvino": "the GPU plugin's ShapePredictor (memory_preallocation.md), settings from --prealloc",
    "none": "no preallocation: exact size on every reallocation",
    "adaptive": "online: a steady step of any size, a doubling horizon under a slack cap, "
                "memory kept across resets",
    "oracle": "knows the future: fewest reallocations possible under the slack cap (simulator only)",
}
ENGINE_POLICIES = ("openvino", "adaptive", "none")
NO_PREALLOC = PreallocSettings(0, 0, 0, 1.0)


@dataclass(frozen=True)
class AdaptiveSettings:
    base_iters: int = 10                   # first horizon, in steps of the detected step
    slack_cap: float = 0.5                 # preallocated slack <= this fraction of the live size,
    min_slack_bytes: int = 10 * 16384      # ... but a steady step may always take what the plugin would
    max_slack_bytes: int = 1 << 30         # absolute cap on preallocated slack
    memory_window: int = 64                # recent iterations whose max counts as "needed soon"

    def __post_init__(self):
        if not (isinstance(self.slack_cap, (int, float)) and math.isfinite(self.slack_cap)
                and self.slack_cap >= 0):
            raise ValueError(f"slack cap must be a finite number >= 0, got {self.slack_cap!r}")


def slack_limit(need: int, cap: float, floor_elems: int = 0) -> int:
    """Largest allocation (elements) within a slack of ``cap`` x the live size ``need``, or of
    ``floor_elems`` when that is more."""
    return need + max(math.floor(need * cap), floor_elems)


class _Track:
    """What the adaptive policy remembers about one buffer's requirements (or about several
    buffers' whose requirements moved together: AdaptivePredictor.replay shares it)."""
    __slots__ = ("t", "last", "step", "streak", "horizon", "horizon_step", "held", "window", "recent",
                 "cycle_start", "cycle_max", "prev_cycle_max", "prev_cycle_len",
                 "users", "unlike")
    # what a buffer's history is (`same_as` compares them)
    HISTORY = ("t", "last", "step", "streak", "horizon", "horizon_step", "held", "cycle_start",
               "cycle_max", "prev_cycle_max", "prev_cycle_len")

    def __init__(self, window: int):
        self.t = 0                    # requirements seen
        self.last: tuple | None = None
        self.step: tuple | None = None
        self.streak = 0               # consecutive growth steps equal to self.step
        self.horizon = 0              # steps of the last steady preallocation
        self.horizon_step: tuple | None = None
        self.held = False             # every growth since that preallocation matched its step
        # (t, need) of the last `window` requirements, needs decreasing: recent[0] is their
        # max (a monotonic queue: the policy asks for it on every call, replays included)
        self.window = window
        self.recent: deque = deque()
        self.cycle_start = 0
        self.cycle_max = 0
        self.prev_cycle_max = 0
        self.prev_cycle_len = 0
        self.users = 1                # buffer ids whose track this is
        self.unlike = None            # a track found to differ (not compared again)

    def copy(self) -> "_Track":
        """The same history, for one id on its own (users 1)."""
        c = _Track(self.window)
        for a in _Track.HISTORY:
            setattr(c, a, getattr(self, a))
        c.recent = deque(self.recent)
        return c

    def same_as(self, other: "_Track") -> bool:
        return all(getattr(self, a) == getattr(other, a) for a in _Track.HISTORY) and \
            self.recent == other.recent

    def observe(self, shape: tuple, need: int) -> None:
        last = self.last
        if last is not None and len(shape) == len(last):
            if shape != last:         # a repeated shape is no evidence either way
                diff = tuple(map(operator.sub, shape, last))
                if min(diff) >= 0:
                    self.streak = self.streak + 1 if diff == self.step else 1
                    self.step = diff
                else:
                    self.step, self.streak = None, 0
                if diff != self.horizon_step:
                    self.held = False
        else:
            self.step, self.streak, self.held = None, 0, False
        # A drop below half the cycle's max starts a new cycle (a new prompt, a new batch...)
        if need * 2 < self.cycle_max:
            self.prev_cycle_max = self.cycle_max
            self.prev_cycle_len = self.t - self.cycle_start
            self.cycle_start, self.cycle_max = self.t, need
        else:
            self.cycle_max = max(self.cycle_max, need)
        recent = self.recent
        while recent and recent[-1][1] <= need:
            recent.pop()
        recent.append((self.t, need))
        if recent[0][0] <= self.t - self.window:
            recent.popleft()
        self.last = shape
        self.t += 1

    def needed_soon(self, grace: int) -> int:
        """Elements this buffer is expected to need again soon: the recent max, and the last
        cycle's max while the current cycle has had about as long as that one to get there."""
        soon = self.recent[0][1]
        if self.prev_cycle_max and self.t - self.cycle_start <= self.prev_cycle_len * 3 // 2 + grace:
            soon = max(soon, self.prev_cycle_max)
        return soon


_KEEP = ReallocDecision("reuse", 0, False, "keep", False)   # the common answer, made once


class AdaptivePredictor:
    """Online preallocation policy (sees only the past, as a runtime does).

    On a reallocation:

    * steady growth (the last two non-zero per-dim steps are equal and none shrinks, any size):
      preallocate ``horizon`` steps ahead; the horizon starts at ``base_iters`` and doubles
      (10, 20, 40 ...) each time the previous preallocation was used up by that same step;
    * other growth: ``(1 + slack_cap)`` x the live size;
    * either way at most ``slack_cap`` x the live size of slack (a steady step may always take
      ``min_slack_bytes``, what the plugin's iterations mode allows) and ``max_slack_bytes``,
      but at least what the buffer is expected to need again soon (the max over the last
      ``memory_window`` requirements, and the previous cycle's max after a reset);
    * the 90% device-memory rule as in the plugin: a preallocation that does not fit gives
      the exact size.

    A buffer that still fits is kept, even when the requirement drops (shrink then regrow); it
    is released (reason ``reclaim``) only when both the live size and everything needed soon
    are 10x below its capacity (the plugin's reclaim rule, applied to the near future).
    """

    def __init__(self, settings: AdaptiveSettings = AdaptiveSettings(), device_mem_bytes: int | None = None,
                 *, max_alloc_bytes: int | None = None):
        self.settings = settings
        self.device_mem_bytes = device_mem_bytes
        self.max_alloc_bytes = max_alloc_bytes
        self._tracks: dict[str, _Track] = {}
        # bumped when an id's track is made, split off or joined, or a capacity changes (the
        # groupings kept hold until then); id(a whole plan's calls, or a compiled variant's
        # function) -> (it, version, its groups)
        self.version = 0
        self._plans: dict = {}

    def reset(self) -> None:
        self._tracks.clear()
        self._plans.clear()
        self.version += 1

    def realloc(self, buf: BufferState, id: str, shape: tuple, dtype_bits: int,
                used_bytes: int | None = None) -> ReallocDecision:
        tr = self._own(id)
        need = math.prod(shape)       # a tuple of ints (BufferState.realloc_if_needed)
        tr.observe(shape, need)
        return self._decide(buf, tr, shape, need, dtype_bits, used_bytes)

    def _own(self, id: str) -> _Track:
        """The track of `id` alone: a copy where `replay` shared it with other ids."""
        tr = self._tracks.get(id)
        if tr is None:
            tr = self._tracks[id] = _Track(self.settings.memory_window)
            self.version += 1
            return tr
        return self._alone(id, tr)

    def _alone(self, id: str, tr: _Track) -> _Track:
        """`tr`, the track of `id`, for `id` alone: a copy where other ids share it."""
        if tr.users > 1:
            tr.users -= 1
            tr = self._tracks[id] = tr.copy()
            self.version += 1
        return tr

    def replay(self, calls, used_bytes: int | None = None) -> None:
        """The calls a plan replay repeats, `(buf, id, shape, need, dtype_bits)` each (shape a
        tuple of ints, need its product): the same history and decisions as `realloc` one by
        one, the common answer (keep) without its calls. Buffers whose histories are equal and
        that see the same shape share one track, observed once (a BERT layer's activations,
        a decoder's KV caches); a track is split again where its buffers part: another shape,
        a call without the others, a buffer that grows (`_move_horizon` moves its track)."""
        base = self.settings.base_iters
        grouped = self._grouped(calls)
        if grouped is None:
            self._one_at_a_time(calls, used_bytes)
            return
        rows, groups, _ = grouped
        soon = {}                          # track -> what a buffer must not exceed 10x of to keep
        for tr, (shape, need, _) in groups.items():
            tr.observe(shape, need)
            soon[tr] = tr.needed_soon(base) * RECLAIM_FACTOR
        for buf, tr, id, shape, need, bits in rows:
            if buf.has_buffer and need <= buf.cap_elems and soon[tr] >= buf.cap_elems:
                continue
            self._decide(buf, self._alone(id, tr), shape, need, bits, used_bytes)

    def replay_plan(self, reallocs, used_bytes: int | None = None) -> None:
        """A whole plan's calls, `(tensor, id, shape, need, bits)` each, the same list at every
        replay of the plan: `replay`, its grouping kept while no track is made, split off or
        joined (`version`), with each group's buffers' capacities (fixed while the plan lives:
        its epoch changes no buffer), so that a replay whose groups all keep observes each
        shared history once and looks at no buffer."""
        hit = self._plans.get(id(reallocs))
        if hit is None or hit[0] is not reallocs or hit[1] != self.version:
            calls = [(t.state, name, shape, need, bits) for t, name, shape, need, bits in reallocs]
            grouped = self._grouped(calls)
            if grouped is None:
                self._one_at_a_time(calls, used_bytes)
                return
            rows, groups, _ = grouped
            summary = []
            for tr, (shape, need, at) in groups.items():
                bufs = [rows[k][0] for k in at]
                summary.append((tr, shape, need, at, all(b.has_buffer for b in bufs) and
                                need <= min(b.cap_elems for b in bufs), max(b.cap_elems for b in bufs)))
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[id(reallocs)] = hit = (reallocs, self.version, summary)
        base = self.settings.base_iters
        for tr, shape, need, at, fits, cap in hit[2]:
            tr.observe(shape, need)
            soon = tr.needed_soon(base) * RECLAIM_FACTOR
            if fits and soon >= cap:
                continue                   # every buffer of the group keeps
            for k in at:                   # (the rows of `replay`)
                t, name, shape_k, need_k, bits = reallocs[k]
                buf = t.state
                if buf.has_buffer and need_k <= buf.cap_elems and soon >= buf.cap_elems:
                    continue
                self._decide(buf, self._alone(name, self._tracks[name]), shape_k, need_k, bits, used_bytes)

    def observe_kept(self, calls, key=None) -> None:
        """`replay` of calls whose buffers surely keep (surely_keeps said so for each): their
        histories only, the decisions being keeps. `calls`: `(tensor, id, shape, need, bits)`
        each (the tensor is not looked at but for its `state` where an id comes twice). `key`:
        an object whose calls name the same buffers in one order every time (a compiled
        variant's function), whose grouping is kept while no track is made, split off or
        joined (`version`) and each group still sees one shape."""
        hit = self._plans.get(id(key)) if key is not None else None
        if hit is not None and hit[0] is key and hit[1] == self.version and \
                all(calls[k][2] == calls[at[0]][2] for _, at in hit[2] for k in at):
            for tr, at in hit[2]:
                tr.observe(calls[at[0]][2], calls[at[0]][3])
            return
        grouped = self._grouped(calls)
        if grouped is None:
            self._one_at_a_time([(t.state, name, shape, need, bits) for t, name, shape, need, bits in calls])
            return
        for tr, (shape, need, _) in grouped[1].items():
            tr.observe(shape, need)
        if key is not None:
            self._keep_grouping(key, grouped[1])

    def group_ahead(self, calls, key) -> None:
        """observe_kept's grouping of `key`'s calls made now, nothing observed: its tracks
        that agree are merged, and the grouping is kept for its first observe_kept."""
        grouped = self._grouped(calls)
        if grouped is not None:
            self._keep_grouping(key, grouped[1])

    def _keep_grouping(self, key, groups: dict) -> None:
        if len(self._plans) >= PLANS_KEPT:
            self._plans.clear()
        self._plans[id(key)] = (key, self.version, [(tr, at) for tr, (_, _, at) in groups.items()])

    def _one_at_a_time(self, calls, used_bytes: int | None = None) -> None:
        """`realloc` for each call: where an id comes twice among them (no grouping)."""
        for buf, id, shape, _, bits in calls:
            self.realloc(buf, id, shape, bits, used_bytes)

    def _grouped(self, calls) -> tuple | None:
        """`_group`'s answer for `calls`, the version moved where it made, joined or split a
        track (replay_plan's groupings then no longer hold)."""
        grouped = _group(self._tracks, calls, self.settings.memory_window)
        if grouped is None or grouped[2]:
            self.version += 1
        return grouped

    def soon_at_least(self, id: str, need: int) -> int:
        """A lower bound of what `needed_soon` says once a requirement of `need` elements of
        buffer `id` is observed: the largest requirement its window keeps after it."""
        tr = self._tracks.get(id)
        if tr is None:
            return need
        oldest = tr.t - tr.window          # (observe drops what is that old)
        for t, n in tr.recent:             # needs decreasing: the first kept is their max
            if t > oldest:
                return max(n, need)
        return need

    def _decide(self, buf: BufferState, tr: _Track, shape: tuple, need: int, dtype_bits: int,
                used_bytes: int | None) -> ReallocDecision:
        soon = tr.needed_soon(self.settings.base_iters)
        reclaimed = False
        if buf.has_buffer and need <= buf.cap_elems:
            if soon * RECLAIM_FACTOR >= buf.cap_elems:
                return _KEEP
            reclaimed = True
        steady = self._move_horizon(tr) if buf.has_buffer else None
        return self._take(buf, tr, shape, need, dtype_bits, steady, soon, used_bytes, reclaimed)

    def _take(self, buf: BufferState, tr: _Track, shape: tuple, need: int, dtype_bits: int,
              steady: bool | None, soon: int, used_bytes: int | None, reclaimed: bool,
              sized: tuple | None = None) -> ReallocDecision:
        """The decision to allocate for a buffer that does not keep, its track's horizon moved
        (`steady`; None: it has no buffer yet, nothing to predict from): at least what it needs
        soon, the exact need where the 90% rule refuses the extra. `sized`: `_size`'s answer,
        worked out already (the buffers of one track in a growth)."""
        alloc, mode = sized or self._size(tr, shape, need, dtype_bits, steady)
        alloc = max(alloc, soon)
        used = _bytes_for(buf.held_elems, dtype_bits) if used_bytes is None else used_bytes
        if alloc > need and not can_preallocate(alloc * ((dtype_bits + 7) // 8), used,
                                                self.device_mem_bytes, self.max_alloc_bytes):
            alloc, mode = need, "exact"
        buf.take(alloc)
        self.version += 1                  # (a capacity replay_plan keeps changed)
        return ReallocDecision("alloc", alloc, alloc > need, mode, reclaimed)

    def _size(self, tr: _Track, shape: tuple, need: int, dtype_bits: int, steady: bool | None) -> tuple[int, str]:
        """(elements, mode) a buffer that does not keep asks for before the 90% rule."""
        if steady is None:
            return need, "first"
        return self._grow_size(tr, shape, need, dtype_bits, steady)

    def _move_horizon(self, tr: _Track) -> bool:
        """What a reallocation from a buffer does to its track; whether it is a steady step."""
        if tr.streak >= 2:
            h = tr.horizon * 2 if tr.held and tr.horizon_step == tr.step else self.settings.base_iters
            tr.horizon, tr.horizon_step, tr.held = h, tr.step, True
            return True
        tr.horizon_step, tr.held = None, False
        return False

    def _grow_size(self, tr: _Track, shape: tuple, need: int, dtype_bits: int, steady: bool) -> tuple[int, str]:
        """The elements a buffer that grows asks for, its track's horizon moved (`steady`)."""
        s = self.settings
        per_elem_bits = max(dtype_bits, 1)
        if steady:
            want = _shape_size(c + d * tr.horizon for c, d in zip(shape, tr.step))
            limit = slack_limit(need, s.slack_cap, s.min_slack_bytes * 8 // per_elem_bits)
            mode = "steady"
        else:
            limit = slack_limit(need, s.slack_cap)
            want, mode = limit, "grow"
        limit = min(limit, need + s.max_slack_bytes * 8 // per_elem_bits)
        return max(need, min(want, limit)), mode


def _group(tracks: dict, calls, window: int) -> tuple | None:
    """AdaptivePredictor.replay's calls by track: (rows (buf, track, id, shape, need, bits),
    {track: (shape, need, row indices)}), each track observed by exactly the ids that share it,
    all with one shape: a shared track is split where that does not hold, and tracks with
    equal histories that see the same shape are merged. None when an id comes twice; the
    third: whether a track was made, joined or split."""
    rows, groups, by_shape, ids, changed = [], {}, {}, set(), False
    for buf, id, shape, need, bits in calls:
        if id in ids:
            return None
        ids.add(id)
        tr = tracks.get(id)
        if tr is None:
            tr = tracks[id] = _Track(window)
            changed = True
        g = groups.get(tr)
        if g is not None and g[0] != shape:        # a sharer parts: its own copy
            tr.users -= 1
            tr = tracks[id] = tr.copy()
            g, changed = None, True
        if g is None:
            first = by_shape.get(shape)
            if first is not None and tr.users == 1 and tr.unlike is not first:
                if tr.same_as(first):               # (compared once per pair)
                    tr, g = first, groups[first]
                    tr.users += 1
                    tracks[id] = tr
                    changed = True
                else:
                    tr.unlike = first
            if g is None:
                g = groups[tr] = (shape, need, [])
                by_shape.setdefault(shape, tr)
        g[2].append(len(rows))
        rows.append((buf, tr, id, shape, need, bits))
    for tr, (shape, need, at) in list(groups.items()):
        if len(at) < tr.users:                     # sharers absent: those here split off together
            tr.users -= len(at)
            new = tr.copy()
            new.users = len(at)
            for k in at:
                buf, _, id, shape_k, need_k, bits = rows[k]
                tracks[id] = new
                rows[k] = (buf, new, id, shape_k, need_k, bits)
            del groups[tr]
            groups[new] = (shape, need, at)
            changed = True
    return rows, groups, changed


def growth_decisions(policy, calls):
    """The policy's decisions for the predictor calls `(tensor, id, shape, need, bits)` of a
    compiled inference whose buffers move (engine/fast_path/growth.py), each asked for where
    the flow asks (its order, the memory used then): `keeps(k)`, `decide(k, used_bytes)`, then
    `finish()` once."""
    if isinstance(policy, AdaptivePredictor):
        grouped = policy._grouped([(t.state, name, shape, need, bits) for t, name, shape, need, bits in calls])
        if grouped is not None:
            return _GroupedGrowth(policy, grouped[0], grouped[1])
    return _OneByOne(policy, calls)


class _OneByOne:
    """A policy's realloc, call by call. A call it surely keeps (surely_keeps) need not be
    asked in order: those not asked are repeated by `finish` (their histories only)."""
    __slots__ = ("policy", "calls", "surely", "asked")

    def __init__(self, policy, calls):
        self.policy, self.calls = policy, calls
        # (an id asked twice has its calls in order: none is put off)
        unique = len({name for _, name, _, _, _ in calls}) == len(calls)
        self.surely = [unique and surely_keeps(policy, t.state, need, name) for t, name, _, need, _ in calls]
        self.asked = set()

    def keeps(self, k: int) -> bool:
        return self.surely[k]

    def decide(self, k: int, used_bytes: int | None) -> ReallocDecision:
        self.asked.add(k)
        t, name, shape, _, bits = self.calls[k]
        return t.state.realloc_if_needed(self.policy, name, shape, bits, used_bytes)

    def finish(self) -> None:
        for k, (t, name, shape, _, bits) in enumerate(self.calls):
            if self.surely[k] and k not in self.asked:
                t.state.realloc_if_needed(self.policy, name, shape, bits)


class _GroupedGrowth:
    """AdaptivePredictor's decisions for a growth, worked out once per shared history: every
    call is observed up front, once per track (replay's grouping); the buffers of a track
    that grow from a buffer share one copy of it, its horizon moved once (the flow moves each
    one's copy alike); each decision's size is then final where the flow makes it (`_take`:
    the 90% rule with the memory used then)."""
    __slots__ = ("policy", "rows", "plans", "sizes")

    def __init__(self, policy: AdaptivePredictor, rows: list, groups: dict):
        self.policy, self.rows = policy, rows
        self.sizes: dict = {}               # AdaptivePredictor._size's answers
        self.plans = [None] * len(rows)     # k -> (track, soon, steady or None for "first", reclaimed)
        base, tracks = policy.settings.base_iters, policy._tracks
        for tr, (shape, need, at) in groups.items():
            tr.observe(shape, need)
            soon = tr.needed_soon(base)
            growing = []
            for k in at:
                buf = rows[k][0]
                fits = buf.has_buffer and need <= buf.cap_elems
                if fits and soon * RECLAIM_FACTOR >= buf.cap_elems:
                    continue                # keeps
                if buf.has_buffer:
                    growing.append((k, fits))
                else:
                    self.plans[k] = (tr, soon, None, False)
            if not growing:
                continue
            if len(growing) < len(at):      # the others' track does not move
                moved = tr.copy()
                moved.users, tr.users = len(growing), tr.users - len(growing)
                for k, _ in growing:
                    tracks[rows[k][2]] = moved
                tr = moved
                policy.version += 1
            steady = policy._move_horizon(tr)
            for k, reclaimed in growing:
                self.plans[k] = (tr, soon, steady, reclaimed)

    def keeps(self, k: int) -> bool:
        return self.plans[k] is None

    def decide(self, k: int, used_bytes: int | None) -> ReallocDecision:
        plan = self.plans[k]
        if plan is None:
            return _KEEP
        tr, soon, steady, reclaimed = plan
        buf, _, _, shape, need, bits = self.rows[k]
        # (what _size reads: the same for the buffers of a track that grow alike)
        key = tr, steady, shape, need, bits
        sized = self.sizes.get(key)
        if sized is None:
            sized = self.sizes[key] = self.policy._size(tr, shape, need, bits, steady)
        return self.policy._take(buf, tr, shape, need, bits, steady, soon, used_bytes, reclaimed, sized)

    def finish(self) -> None:
        pass


PLANS_KEPT = 256    # groupings kept: whole plans' (replay_plan; a fast path keeps 64 plans) and
# compiled variants' (observe_kept)


def surely_keeps(policy, buf: BufferState, need: int, id: str) -> bool:
    """Whether `policy` keeps `buf` (named `id`) for a requirement of `need` elements: the
    buffer fits and is not 10x too large (the plugin's ShapePredictor and the adaptive policy
    reuse then; what they remember only ever keeps more), or, for the adaptive policy, a
    requirement still in its window after this one is (a short length after long ones). A
    compiled plan checks every buffer so before it makes the policy's calls
    (engine/fast_path/compiled.py); False for other policies."""
    if not buf.has_buffer or need > buf.cap_elems:
        return False
    if need * RECLAIM_FACTOR >= buf.cap_elems:
        return isinstance(policy, (AdaptivePredictor, ShapePredictor))
    return isinstance(policy, AdaptivePredictor) and policy.soon_at_least(id, need) * RECLAIM_FACTOR >= buf.cap_elems


class OraclePredictor:
    """Knows each buffer's whole future requirement sequence (simulator only).

    It reallocates only when the buffer is too small, and then allocates the max requirement
    over the longest window ``[t, j)`` of the future whose every requirement is within the
    slack limit of the live size at ``t`` (``(1 + slack_cap)`` x live, or live + ``min_slack_bytes``
    when that is more, the same limit the adaptive policy has for a steady step): the largest
    buffer the limit allows, trimmed to what will really be used before the next forced
    reallocation.

    Among policies that reallocate only when the buffer is too small and never allocate more
    than that limit, this makes the fewest reallocations (the next
    forced point is as late as the cap allows, and a later forced point has a larger live size,
    so a larger allowed buffer), which makes it the lower bound the online policies are
    measured against. tests/test_predictor_sim.py checks it by exhaustive search.
    """

    def __init__(self, future: dict[str, list], slack_cap: float = AdaptiveSettings.slack_cap,
                 min_slack_bytes: int = 0):
        self.slack_cap = slack_cap
        self.min_slack_bytes = min_slack_bytes
        self._needs = {id: [_shape_size(s) for s in shapes] for id, shapes in future.items()}
        self._t: dict[str, int] = {}

    def reset(self) -> None:
        self._t.clear()

    def realloc(self, buf: BufferState, id: str, shape: tuple, dtype_bits: int,
                used_bytes: int | None = None) -> ReallocDecision:
        t = self._t.get(id, 0)
        self._t[id] = t + 1
        needs = self._needs[id]
        need = _shape_size(shape)
        if t >= len(needs) or needs[t] != need:
            raise ValueError(f"oracle for {id!r}: step {t} requires {need} elements, "
                             "not what its future said")
        if buf.has_buffer and need <= buf.cap_elems:
            return ReallocDecision("reuse", 0, False, "oracle", False)
        limit = slack_limit(need, self.slack_cap, self.min_slack_bytes * 8 // max(dtype_bits, 1))
        alloc = need
        for n in needs[t:]:
            if n > limit:
                break
            alloc = max(alloc, n)
        buf.take(alloc)
        return ReallocDecision("alloc", alloc, alloc > need, "oracle", False)


def make_predictor(name: str, prealloc: PreallocSettings = PreallocSettings(),
                   device_mem_bytes: int | None = None, *, adaptive: AdaptiveSettings = AdaptiveSettings(),
                   future: dict | None = None):
    """The policy object for ``name`` (see POLICIES); ``future`` (id -> shapes) is the oracle's."""
    if name == "openvino":
        return ShapePredictor(prealloc, device_mem_bytes)
    if name == "none":
        return ShapePredictor(NO_PREALLOC, device_mem_bytes)
    if name == "adaptive":
        return AdaptivePredictor(adaptive, device_mem_bytes)
    if name == "oracle":
        if future is None:
            raise ValueError("the oracle policy needs the whole future: predictor-sim only")
        return OraclePredictor(future, adaptive.slack_cap, adaptive.min_slack_bytes)
    raise ValueError(f"unknown predictor {name!r}: choose from {', '.join(POLICIES)}")
