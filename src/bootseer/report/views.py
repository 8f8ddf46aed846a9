"""One job's events as views: per attempt, per node, what the summary needs (time to ready,
the top-level phases, the ranks' phases and ready marks, the techniques' figures), and the
lanes the charts and exports draw.

Clocks: nodes disagree. If every node of an attempt recorded a ``rendezvous`` mark, node
clocks are shifted so those marks coincide (the rendezvous is one instant for the whole
job); otherwise wall clocks are used as they are (NTP-synchronised). The report says which.
Within a node the monotonic clock is the reference: an event whose wall times disagree with
its recorded monotonic times (the wall clock stepped during it) is placed from the node's
usual wall-minus-monotonic offset and keeps its monotonic duration.

Tracks: each span and mark is put on a lane, one per pipeline per process of a node
(``image``, ``deps``, ``ckpt``, ``job``, ...; the pipeline of a span is that of its top-level
ancestor), and within a lane on a track whose slices nest properly (a span overlapping
another without nesting in it, e.g. a phase reported by ``emit``, opens a second track).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from typing import TypeGuard

UNTRACED = "(untraced)"   # time to ready not covered by any top-level phase on the node
CLOCK_STEP_S = 0.5        # wall and monotonic clocks disagreeing by more: the wall clock stepped
NEST_EPS_S = 1e-6

# the pipeline a phase belongs to, by its first name component; the auto-capture's phases
# of a training process (interpreter, imports, init, first step) are its "job" pipeline
PIPELINE_OF = {"python": "job", "import": "job", "dist": "job", "train": "job",
               "model": "job", "rendezvous": "job", "ready": "job"}
PIPELINE_ORDER = ["startup", "container", "image", "deps", "ckpt", "job"]


@functools.lru_cache(maxsize=4096)
def pipeline_of(phase: str) -> str:
    head = phase.split(".", 1)[0]
    return PIPELINE_OF.get(head, head)


def covered(intervals: list[tuple[float, float]]) -> float:
    if len(intervals) == 1:
        return max(intervals[0][1] - intervals[0][0], 0.0)
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@dataclass
class NodeView:
    """One node of an attempt. What the summary needs is computed for every node; the
    lanes (``spans``, ``marks``, ``lanes``: what the charts and exports draw) on first use,
    since a 10,000-node report draws 24 of them."""
    node: str
    gpus: int
    start: float
    ready: float | None
    phases: dict[str, float] = field(default_factory=dict)   # top-level phase -> seconds
    failed: list[str] = field(default_factory=list)
    last_rank: int | None = None                              # the rank that was ready last
    missing_ranks: list[int] = field(default_factory=list)    # ranks that never got ready
    last_end: float = 0.0                                     # the last span's end
    # per rank (or "pid N"): the job's phases as RANK_COLUMNS name them -> intervals
    rank_phases: dict = field(default_factory=dict)
    rank_ready: dict = field(default_factory=dict)            # per rank: its ready mark
    rank_warm: dict = field(default_factory=dict)             # per rank: its job.warm attrs
    windows: list[dict] = field(default_factory=list)         # image.window marks' attrs
    ckpt_loads: list[tuple] = field(default_factory=list)     # ckpt.load: (attrs, seconds)
    deps_fetches: list[tuple] = field(default_factory=list)   # deps.fetch/extract: (phase, attrs)
    collectives: dict = field(default_factory=dict)           # COLLECTIVES -> latest start
    _source: tuple | None = field(default=None, repr=False, compare=False)
    _lanes: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def to_ready(self) -> float | None:
        return None if self.ready is None else self.ready

    @property
    def spans(self) -> list[dict]:
        """Spans: phase, start, end, status, parent, pid, rank, lane, attrs, track, depth."""
        return self._lanes_built()[0]

    @property
    def marks(self) -> list[dict]:
        """Instants (phase, t, lane, rank, pid, attrs), in time order."""
        return self._lanes_built()[1]

    @property
    def lanes(self) -> list[str]:
        """Lane labels in display order."""
        return self._lanes_built()[2]

    def _lanes_built(self) -> tuple:
        if self._lanes is None:
            self._lanes = _build_lanes(*self._source) if self._source else ([], [], [])
            self._source = None
        return self._lanes


@dataclass
class AttemptView:
    attempt: int
    nodes: list[NodeView]
    t0: float
    alignment: str
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> float | None:
        vals = [n.ready for n in self.nodes if n.ready is not None]
        return None if len(vals) < len(self.nodes) or not vals else max(vals)

    @property
    def not_ready(self) -> list[NodeView]:
        return [n for n in self.nodes if n.ready is None]


def attempts(events: list[dict]) -> list[AttemptView]:
    by_attempt: dict[int, dict[str, list[dict]]] = {}
    last_a = last_n = group = None
    for e in events:   # a file's events share attempt and node: find their list on a change
        a, n = e["attempt"], e["node"]
        if n != last_n or a != last_a or group is None:
            group = by_attempt.setdefault(int(a), {}).setdefault(str(n), [])
            last_a, last_n = a, n
        group.append(e)
    return [_attempt(a, by_node) for a, by_node in sorted(by_attempt.items())]


def wall_times(evs: list[dict]) -> tuple[list[tuple[float, float]], int]:
    """(start, end) of each of a node's events (in order), trusting the monotonic clock.

    Each event recorded both clocks; their difference is the same for every event of a node
    unless the wall clock stepped (NTP, an operator). The node's usual difference (the
    median) places an event whose own difference or duration disagrees with it, and its
    duration is the monotonic one. Events without monotonic times keep their wall times.
    Returns the times and how many events were placed from the monotonic clock."""
    times, fixed, _ = _clock(evs)
    return times, fixed


def _clock(evs: list[dict]) -> tuple[list[tuple[float, float]], int, int | None]:
    """:func:`wall_times`, and the index of the node's first ``rendezvous`` mark (None),
    in one pass over the events (this runs for every event of the trace)."""
    times = []
    rendezvous = None
    mono = []   # (index, start, end, mono_start, mono_end) of the events with both clocks
    for i, e in enumerate(evs):
        s, en = e["start"], e["end"]
        times.append((s, en))
        ms, me = e.get("mono_start"), e.get("mono_end")
        if _is_number(ms) and _is_number(me):
            mono.append((i, s, en, ms, me))
        if rendezvous is None and e["phase"] == "rendezvous" and e.get("kind") == "mark":
            rendezvous = i
    if not mono:
        return times, 0, rendezvous
    offsets = sorted([s - ms for _, s, _, ms, _ in mono])
    ref = offsets[len(offsets) // 2]
    fixed = 0
    for i, s, en, ms, me in mono:
        mono_dur = me - ms if me > ms else 0.0
        if abs(s - ms - ref) > CLOCK_STEP_S or abs((en - s) - mono_dur) > CLOCK_STEP_S \
                or en < s:
            start = ms + ref
            times[i] = (start, start + mono_dur)
            fixed += 1
    return times, fixed, rendezvous


_NUMBER = (int, float)


def _is_number(v: object) -> TypeGuard[float]:
    # a time: an int or a float (bool is an int to Python, not a time to us)
    return type(v) in _NUMBER


DEPS_FETCHES = ("deps.fetch", "deps.extract")   # where a restore says what it fetched


def _lane_of(e: dict, parents: dict) -> tuple:
    """(pipeline, pid) of an event: the pipeline of its top-level ancestor in its process."""
    name, seen = e["phase"], 0
    parent = e.get("parent")
    while parent and seen < 32:   # parent names one enclosing phase of the same thread
        name, parent, seen = parent, parents.get((e.get("pid"), parent)), seen + 1
    return pipeline_of(name), e.get("pid")


def _lane_labels(keys: set, ranks: dict) -> dict:
    """Display labels of a node's lanes: the pipeline, with the rank (or process) when
    several processes of the node run the same pipeline."""
    if len({key[0] for key in keys}) == len(keys):   # one process per pipeline: the usual
        return {key: key[0] for key in keys}
    per_pipeline: dict[str, list] = {}
    for key in keys:
        per_pipeline.setdefault(key[0], []).append(key)
    labels = {}
    for pipeline, group in per_pipeline.items():
        for key in group:
            rank = ranks.get(key[1])
            if len(group) == 1:
                labels[key] = pipeline
            elif rank is not None and sum(ranks.get(k[1]) == rank for k in group) == 1:
                labels[key] = f"{pipeline} rank {rank}"
            else:
                labels[key] = f"{pipeline} pid {key[1]}"
    return labels


@functools.lru_cache(maxsize=4096)   # the same few labels on every node
def _lane_sort_key(label: str):
    pipeline = label.split(" ", 1)[0]
    order = PIPELINE_ORDER.index(pipeline) if pipeline in PIPELINE_ORDER else len(PIPELINE_ORDER)
    return order, pipeline, len(label), label


def _assign_tracks(spans: list[dict]) -> None:
    """Give each span of one lane a ``track`` (0, 1...) and ``depth`` such that the slices
    of a track nest properly: a span that overlaps the open slice without fitting inside it
    goes to the next track that can take it."""
    tracks: list[list[float]] = []          # per track: the ends of the open slices
    for s in sorted(spans, key=lambda x: (x["start"], -x["end"])):
        for i, stack in enumerate(tracks):
            while stack and stack[-1] <= s["start"] + NEST_EPS_S:
                stack.pop()
            if not stack or s["end"] <= stack[-1] + NEST_EPS_S:
                s["track"] = i
                break
        else:
            tracks.append([])
            s["track"], stack = len(tracks) - 1, tracks[-1]
        s["depth"] = len(stack)
        stack.append(s["end"])


def _attempt(attempt: int, by_node: dict[str, list[dict]]) -> AttemptView:
    problems = []
    times: dict[str, list[tuple[float, float]]] = {}   # per node, in its events' order
    rdzv: dict[str, float | None] = {}                 # per node, its rendezvous mark
    for n, evs in sorted(by_node.items()):
        times[n], fixed, i = _clock(evs)
        rdzv[n] = None if i is None else times[n][i][0]
        if fixed:
            problems.append(f"attempt {attempt} node {n}: the wall clock stepped; {fixed} "
                            f"event(s) placed by the monotonic clock")
    offsets = dict.fromkeys(by_node, 0.0)
    alignment = "wall clock (NTP)"
    marked = {n: v for n, v in rdzv.items() if v is not None}
    if len(by_node) > 1 and len(marked) == len(rdzv):
        ref = statistics.median(marked.values())
        offsets = {n: ref - v for n, v in marked.items()}
        alignment = "rendezvous marks"
    t0 = min(min(times[n])[0] + offsets[n] for n in by_node)
    nodes = [_node_view(n, evs, times[n], offsets[n] - t0) for n, evs in sorted(by_node.items())]
    return AttemptView(attempt, nodes, t0, alignment, problems)


def _node_view(n: str, evs: list[dict], times: list[tuple[float, float]],
               off: float) -> NodeView:
    """One node's view from its events (in order) and their times, shifted by ``off``: one
    pass over the events for what the summary needs (a 10,000-node report makes 70,000
    of them: locals, no per-event calls where a dict lookup does); lanes come later."""
    # a node is ready when every training rank on it is (the last rank's ready mark);
    # a rank that wrote events but no ready mark was killed or failed first. Keyed by
    # rank, not process: helpers started for a rank (a mount's server reporting its
    # load) carry the rank's RANK and never mark ready themselves.
    readies: dict = {}
    ranks: set = set()
    pid_rank: dict = {}
    gpus, seen_gpus = 0, None
    nested = False
    tops: list = []                    # top-level spans: (phase, pid, start, end)
    failed: list = []
    rank_phases: dict = {}
    rank_ready: dict = {}
    rank_warm: dict = {}
    windows: list = []
    ckpt_loads: list = []
    deps_fetches: list = []
    collectives: dict = {}
    last_end = float("-inf")
    last_rank = last_pid = None
    for e, (s, en) in zip(evs, times, strict=True):
        s += off
        en += off
        get = e.get
        rank, pid, phase, parent = get("rank"), get("pid"), e["phase"], get("parent")
        if rank is not None and (rank != last_rank or pid != last_pid):
            ranks.add(rank)
            pid_rank[pid] = rank
            last_rank, last_pid = rank, pid
        g = get("gpus")
        if g != seen_gpus:
            gpus, seen_gpus = max(gpus, int(g or 0)), g
        if parent:
            nested = True
        if get("kind") == "mark":
            if phase == "ready":
                who = rank if rank is not None else ("pid", pid)
                readies[who] = max(readies.get(who, float("-inf")), s)
                who = rank if rank is not None else f"pid {pid}"
                rank_ready[who] = max(rank_ready.get(who, s), s)
            elif phase == "image.window":
                windows.append(get("attrs") or {})
            continue
        if en > last_end:
            last_end = en
        if get("status", "ok") == "failed":
            failed.append(phase)
        if phase == "ckpt.load":
            ckpt_loads.append((get("attrs") or {}, en - s))
        elif phase in DEPS_FETCHES:
            deps_fetches.append((phase, get("attrs") or {}))
        elif phase == "job.warm":   # the warm launcher's outcome (warm/worker.py)
            rank_warm[rank if rank is not None else f"pid {pid}"] = get("attrs") or {}
        if not parent:
            tops.append((phase, pid, s, en))
            col = _rank_column(phase)
            if col is not None:
                who = rank if rank is not None else f"pid {pid}"
                rank_phases.setdefault(who, {}).setdefault(col, []).append((s, en))
            if phase in COLLECTIVES and s > collectives.get(phase, float("-inf")):
                collectives[phase] = s
    missing = [r for r in ranks if r not in readies]
    ready = max(readies.values()) if readies and not missing else None
    last = max(readies, key=lambda who: readies[who]) if readies else None
    # the breakdown explains the time to ready: what a phase spends after the node is
    # ready (the job itself, a mount reporting at unmount) is not startup; several
    # processes on one node (ranks) run a phase side by side: the node's time in a phase
    # is its slowest process's (sum over that process's spans)
    per_pid: dict = {}
    for phase, pid, s, en in tops:
        if ready is not None:
            if s >= ready:
                continue
            en = min(en, ready)
        key = (phase, pid)
        per_pid[key] = per_pid.get(key, 0.0) + max(0.0, en - s)
    phases: dict[str, float] = {}
    for (phase, _), took in per_pid.items():
        if took > phases.get(phase, -1.0):
            phases[phase] = took
    start = min(times)[0] + off
    if ready is not None:  # time before ready that no top-level phase covers
        gap = ready - start - covered([(s, min(en, ready)) for _, _, s, en in tops
                                        if s < ready])
        if gap > 1e-3:
            phases[UNTRACED] = gap
    return NodeView(node=n, gpus=gpus, start=start, ready=ready, phases=phases, failed=failed,
                    last_rank=last if last in ranks else None,
                    missing_ranks=sorted(missing, key=str),
                    last_end=last_end if last_end > float("-inf") else 0.0,
                    rank_phases=rank_phases, rank_ready=rank_ready, rank_warm=rank_warm,
                    windows=windows,
                    ckpt_loads=ckpt_loads, deps_fetches=deps_fetches,
                    collectives=collectives,
                    _source=(evs, times, off, pid_rank, nested))


def _build_lanes(evs: list[dict], times: list[tuple[float, float]], off: float,
                 pid_rank: dict, nested: bool) -> tuple[list[dict], list[dict], list[str]]:
    """A node's spans and marks (their times shifted by ``off``) on their lanes and tracks,
    and its lane labels in order."""
    if nested:   # each span's parent, to find the top-level ancestor's pipeline
        parents = {(e.get("pid"), e["phase"]): e.get("parent") for e in evs
                   if e.get("kind") != "mark"}
        lane_keys = [_lane_of(e, parents) for e in evs]
    else:
        lane_keys = [(pipeline_of(e["phase"]), e.get("pid")) for e in evs]
    labels = _lane_labels(set(lane_keys), pid_rank)
    spans: list[dict] = []
    marks: list[dict] = []
    by_lane: dict[str, list[dict]] = {}
    for e, (s, en), key in zip(evs, times, lane_keys, strict=True):
        get = e.get
        lane = labels[key]
        s += off
        en += off
        if get("kind") == "mark":
            marks.append({"phase": e["phase"], "t": s, "lane": lane, "rank": get("rank"),
                          "pid": get("pid"), "attrs": get("attrs") or {}})
            continue
        span = {"phase": e["phase"], "start": s, "end": en, "status": get("status", "ok"),
                "parent": get("parent"), "pid": get("pid"), "rank": get("rank"), "lane": lane,
                "attrs": get("attrs") or {}, "track": 0, "depth": 0}
        spans.append(span)
        by_lane.setdefault(lane, []).append(span)
    for lane_spans in by_lane.values():
        if len(lane_spans) > 1:   # one span: track 0, depth 0 already
            _assign_tracks(lane_spans)
    marks.sort(key=lambda m: m["t"])
    return spans, marks, sorted(set(labels.values()), key=_lane_sort_key)


# the job's own phases per rank, from the auto-capture (trace/auto.py) or the simulator
RANK_COLUMNS = [("python.start", "interpreter"), ("import.*", "imports"),
                ("dist.init", "dist.init"), ("dist.first_collective", "first collective"),
                ("ckpt.load", "ckpt.load"), ("model.init", "model.init"),
                ("train.first_step", "first step"), ("job.warm", "warm start")]
# where every rank waits for the slowest: the first collective (auto-capture) if traced,
# else init_process_group (its store rendezvous)
COLLECTIVES = ("dist.first_collective", "dist.init")
RANK_COLUMN = {phase: col for phase, col in RANK_COLUMNS if not phase.endswith("*")}


@functools.lru_cache(maxsize=4096)   # the same few phase names on every node
def _rank_column(phase: str) -> str | None:
    """The per-rank table's column of a top-level phase (None: not one of the job's)."""
    return RANK_COLUMN.get(phase) or ("imports" if phase.startswith("import.") else None)
