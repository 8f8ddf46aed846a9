"""Prometheus text exposition format, for node_exporter's textfile collector (a ``.prom``
file in its ``--collector.textfile.directory``) or a Pushgateway: the startup figures of
one job, labelled by job id and attempt (and phase, pipeline, technique).

Metrics (gauges but for the histogram and the summary; one unit per family, in its name):

- ``bootseer_startup_time_to_ready_seconds``: slowest node's time to ready (absent when a
  node never got ready: ``bootseer_startup_nodes_not_ready`` says how many);
- ``bootseer_startup_node_ready_seconds``: histogram of the nodes' times to ready;
- ``bootseer_startup_phase_seconds{phase,quantile}``: a summary over nodes (quantiles 0.5,
  0.9 and 1, the max; ``_sum`` and ``_count``);
- ``bootseer_startup_critical_path_seconds{pipeline}``: what each pipeline held on the path;
- ``bootseer_startup_gpu_seconds_lost``, ``bootseer_startup_stragglers``,
  ``bootseer_startup_nodes``, ``bootseer_startup_restarts`` (per job);
- the techniques' figures (medians over nodes), one family per unit, labelled
  ``technique`` and ``figure``: ``bootseer_startup_technique_ratio`` (image coverage,
  precision), ``_seconds`` (stalls, the image's window, the environment's restore/build/
  install, the checkpoint's first byte), ``_bytes`` (the image's store bytes, the checkpoint
  read), ``_bytes_per_second`` (checkpoint throughput), ``_nodes`` (nodes that reported);
- ``bootseer_startup_gpus``;

and per node (label ``node``), from what the node's image start and checkpoint load
recorded (``image.window``, ``ckpt.load``):

- ``bootseer_node_cache_hit_ratio``: share of the hot set's chunks already in the node cache;
- ``bootseer_node_prefetch_coverage``: share of the bytes read in the window prefetched;
- ``bootseer_node_fetched_bytes{source=origin|peers,pipeline=image|deps|ckpt}``: bytes the
  node's image start, environment restore and checkpoint loads took from the origin and
  from the job's peers (report/sources.py; a source a pipeline did not trace has no sample);
- ``bootseer_node_stall_seconds{technique=image|ckpt}``: time reads waited on the network.

Labels: ``job_id`` (not ``job``, which Prometheus sets to the scrape job: a textfile's own
``job`` would be renamed ``exported_job``), ``attempt``. Every per-attempt sample also has
``gpus_bin`` (1-10, 10-100, ... GPUs, the bins of
``bootseer analyze``) for startup time by job size. deploy/grafana/bootseer-startup.json is
a dashboard over these metrics.
"""

from __future__ import annotations

import math

from bootseer.report.simulate import BIN_NAMES, bin_of
from bootseer.report.summary import Summary
from bootseer.report.views import AttemptView

READY_BUCKETS_S = (5, 10, 20, 30, 60, 90, 120, 180, 300, 600, 900, 1800, 3600)


def _label(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.declared: set[str] = set()

    def metric(self, name: str, kind: str, help_: str) -> None:
        if name not in self.declared:
            self.declared.add(name)
            self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: dict, value: float) -> None:
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{inner}}} {_num(value)}")


def text(job: str, views: list[AttemptView], summaries: list[Summary]) -> str:
    w = _Writer()
    w.metric("bootseer_startup_restarts", "gauge", "Restarts of the job seen in its trace.")
    w.sample("bootseer_startup_restarts", {"job_id": job}, max(len(summaries) - 1, 0))
    for v, s in zip(views, summaries, strict=True):
        gpus = sum(n.gpus for n in v.nodes)
        # job size as the simulator and `analyze` bin it, so dashboards group by it
        base = {"job_id": job, "attempt": s.attempt, "gpus_bin": BIN_NAMES[bin_of(max(gpus, 1))]}
        w.metric("bootseer_startup_gpus", "gauge", "GPUs of the attempt (sum over nodes).")
        w.sample("bootseer_startup_gpus", base, gpus)
        w.metric("bootseer_startup_nodes", "gauge", "Nodes of the attempt.")
        w.sample("bootseer_startup_nodes", base, s.nodes)
        w.metric("bootseer_startup_nodes_not_ready", "gauge", "Nodes that never got ready.")
        w.sample("bootseer_startup_nodes_not_ready", base, len(s.not_ready))
        if s.time_to_ready is not None:
            w.metric("bootseer_startup_time_to_ready_seconds", "gauge",
                     "Time to ready of the attempt (slowest node).")
            w.sample("bootseer_startup_time_to_ready_seconds", base, s.time_to_ready)
        readies = sorted(n.ready for n in v.nodes if n.ready is not None)
        if readies:
            name = "bootseer_startup_node_ready_seconds"
            w.metric(name, "histogram", "Nodes' times to ready.")
            for le in (*READY_BUCKETS_S, math.inf):
                w.sample(f"{name}_bucket", {**base, "le": _num(le) if math.isinf(le) else le},
                         sum(1 for r in readies if r <= le))
            w.sample(f"{name}_sum", base, sum(readies))
            w.sample(f"{name}_count", base, len(readies))
        w.metric("bootseer_startup_gpu_seconds_lost", "gauge", "GPU-seconds spent waiting.")
        w.sample("bootseer_startup_gpu_seconds_lost", base, s.gpu_seconds_lost)
        w.metric("bootseer_startup_stragglers", "gauge", "Nodes ready after median + k*MAD.")
        w.sample("bootseer_startup_stragglers", base, len(s.stragglers))
        for phase, st in sorted(s.phases.items()):
            name = "bootseer_startup_phase_seconds"
            w.metric(name, "summary", "Seconds per top-level phase over nodes (quantile 1: "
                     "the slowest node).")
            for quantile, stat in (("0.5", "median"), ("0.9", "p90"), ("1", "max")):
                w.sample(name, {**base, "phase": phase, "quantile": quantile},
                         getattr(st, stat))
            w.sample(f"{name}_sum", {**base, "phase": phase}, st.sum)
            w.sample(f"{name}_count", {**base, "phase": phase}, st.n)
        for pipeline, sec in s.path_shares.items():
            w.metric("bootseer_startup_critical_path_seconds", "gauge",
                     "Seconds each pipeline held on the critical path to ready.")
            w.sample("bootseer_startup_critical_path_seconds", {**base, "pipeline": pipeline}, sec)
        for technique, figures in sorted(s.figures.items()):
            for figure, value in sorted(figures.items()):
                unit, name, factor = technique_family(figure)
                family = f"bootseer_startup_technique_{unit}"
                w.metric(family, "gauge", f"Technique figures in {unit.replace('_', ' ')} "
                         "(medians over nodes).")
                w.sample(family, {**base, "technique": technique, "figure": name},
                         value * factor)
        _node_metrics(w, base, v, s)
    return _grouped(w.lines)


def technique_family(figure: str) -> tuple[str, str, float]:
    """(unit, figure name, factor) of a technique figure: one unit per metric family, so
    a ratio is never plotted against seconds or megabytes."""
    if figure == "nodes":
        return "nodes", "reported", 1.0
    if figure == "mb_per_s":
        return "bytes_per_second", "read", 1e6
    if figure == "mb":
        return "bytes", "read", 1e6
    if figure.endswith("_bytes"):
        return "bytes", figure[: -len("_bytes")], 1.0
    if figure.endswith("_s"):
        return "seconds", figure[: -len("_s")], 1.0
    return "ratio", figure, 1.0


def _number(v) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


def _node_metrics(w: _Writer, base: dict, view: AttemptView, s: Summary) -> None:
    # from the node's summary figures, not its lanes (built on first use: 10,000 nodes'
    # lanes are most of a report's time)
    for n in view.nodes:
        labels = {**base, "node": n.node}
        window = n.windows[0] if n.windows else {}
        planned = _number(window.get("prefetch_planned_chunks"))
        local = _number(window.get("prefetch_already_local"))
        if planned and local is not None:
            w.metric("bootseer_node_cache_hit_ratio", "gauge",
                     "Share of the hot set's chunks already in the node cache.")
            w.sample("bootseer_node_cache_hit_ratio", labels, local / planned)
        coverage = _number(window.get("coverage"))
        if coverage is not None:
            w.metric("bootseer_node_prefetch_coverage", "gauge",
                     "Share of the bytes read during the image's window that were prefetched.")
            w.sample("bootseer_node_prefetch_coverage", labels, coverage)
        for pipeline, row in s.node_sources.get(n.node, {}).items():
            for source, value in (("origin", row[0]), ("peers", row[1])):
                if value is not None:
                    w.metric("bootseer_node_fetched_bytes", "gauge",
                             "Bytes the node fetched, by source (origin, the job's peers) "
                             "and pipeline.")
                    w.sample("bootseer_node_fetched_bytes",
                             {**labels, "source": source, "pipeline": pipeline}, value)
        stalls = {"image": _number(window.get("stall_s"))}
        ckpt = [_number(a.get("stall_s")) for a, _ in n.ckpt_loads]
        if any(x is not None for x in ckpt):
            stalls["ckpt"] = sum(x for x in ckpt if x is not None)
        for technique, value in stalls.items():
            if value is not None:
                w.metric("bootseer_node_stall_seconds", "gauge",
                         "Seconds the node's reads waited on the network, by technique.")
                w.sample("bootseer_node_stall_seconds", {**labels, "technique": technique},
                         value)


def _grouped(lines: list[str]) -> str:
    """The format wants every sample of a metric right after its HELP/TYPE lines."""
    order: list[str] = []
    groups: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith("# HELP "):
            current = line.split()[2]
            if current not in groups:
                order.append(current)
                groups[current] = []
            groups[current].append(line)
        elif line.startswith("# TYPE "):
            groups[line.split()[2]].append(line)
        else:
            name = line.split("{", 1)[0]
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name[: -len(suffix)] in groups:
                    name = name[: -len(suffix)]
            groups[name].append(line)
    return "\n".join(line for m in order for line in groups[m]) + "\n"
