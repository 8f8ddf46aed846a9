// bootseer report page: draws the charts with uPlot (embedded in the page, no network)
// from the JSON in #report-data. Sets data-rendered="1" on <body> when every chart has
// drawn (data-rendered-ms: milliseconds since navigation), data-error on a failure.
// Each chart's container gets data-geometry: what it drew, in CSS pixels of its plot area
// (rows, rectangles), so a test can check the picture against the text.
"use strict";
window.addEventListener("error", (e) => document.body.setAttribute("data-error", String(e.message)));
(function () {
  let D;
  try {
    D = JSON.parse(document.getElementById("report-data").textContent);
  } catch (e) {
    document.body.setAttribute("data-error", "report data: " + e);
    return;
  }
  const tip = document.getElementById("tip");
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;",
    ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const fmt = (v) => v === null || v === undefined ? "-" :
    (Math.abs(v) < 10 ? v.toFixed(2) : v.toFixed(1));
  const LABEL_W = 190, ROW = 16, W = 1180, FONT = "11px system-ui, sans-serif";
  const AXIS = {stroke: "#444", grid: {stroke: "#eee", width: 1}, ticks: {stroke: "#444", width: 1},
    font: FONT, labelFont: "12px system-ui, sans-serif"};
  let pending = 0;
  const charts = [];

  function legend(el, names, colors) {
    el.innerHTML = names.map((n) => `<span class="key"><i style="background:${colors[n]}">` +
      `</i>${esc(n)}</span>`).join("");
  }
  function showTip(u, html) {
    if (!html) { tip.style.display = "none"; return; }
    const box = u.over.getBoundingClientRect();
    tip.innerHTML = html;
    tip.style.display = "block";
    tip.style.left = (window.scrollX + box.left + u.cursor.left + 14) + "px";
    tip.style.top = (window.scrollY + box.top + u.cursor.top + 10) + "px";
  }
  function drawn() {
    if (--pending === 0) {
      document.body.setAttribute("data-rendered-ms", String(Math.round(performance.now())));
      document.body.setAttribute("data-rendered", "1");
    }
  }

  // A timeline on uPlot's axes: rows top to bottom, rectangles on a seconds axis, drawn on
  // the plot's canvas; row labels in the left margin; tooltips from the rectangle under the
  // cursor, else from the row's own tip. spec: {rows: [{label, color, band, bold, tip}],
  // rects: [{row, x0, x1, color, inset, outline, dashed, tip, text, data}], ticks: [{row,
  // x, tip}] (triangles), lines: [{x, row0, row1, tip}], end, xLabel, topAxis, rowHeight
  // (px), after: (u, ctx, px, X, rowTop) => extra drawing}
  function timeline(el, spec) {
    const n = spec.rows.length, top = spec.topAxis ? 30 : 6;
    const h = top + n * (spec.rowHeight || ROW) + 50;
    const geometry = {rows: spec.rows.map((r) => r.label), rects: [],
      rowTips: spec.rows.map((r) => r.tip || null)};
    // the bottom axis takes 50 px (ticks 30, label 20), the top one 24: rows get the rest
    const axes = [Object.assign({scale: "x", side: 2, label: spec.xLabel, size: 30,
      labelSize: 20}, AXIS),
      {scale: "y", side: 3, size: LABEL_W, show: true, splits: () => [], values: () => [],
        grid: {show: false}, ticks: {show: false}}];
    if (spec.topAxis) axes.push(Object.assign({scale: "x", side: 0, size: 24}, AXIS,
      {grid: {show: false}}));
    pending++;
    let first = true;
    const opts = {
      width: W, height: h, legend: {show: false},
      padding: [top - (spec.topAxis ? 24 : 0), 10, 0, 0],
      scales: {x: {time: false, auto: false, range: () => [0, spec.end]},
        y: {auto: false, range: () => [0, n]}},
      axes,
      series: [{}, {label: "", stroke: "transparent", points: {show: false}}],
      cursor: {y: false, points: {show: false}, drag: {x: false, y: false}},
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx, px = uPlot.pxRatio, b = u.bbox;
          const X = (t) => u.valToPos(Math.max(t, 0), "x", true);
          const rowTop = (i) => u.valToPos(n - i, "y", true);
          const rowH = rowTop(1) - rowTop(0);
          ctx.save();
          ctx.font = `${11 * px}px system-ui, sans-serif`;
          ctx.textBaseline = "middle";
          spec.rows.forEach((r, i) => {
            const y = rowTop(i);
            r.box = [y / px, (y + rowH) / px];   // for its tooltip
            if (r.band) { ctx.fillStyle = r.band; ctx.fillRect(0, y, b.left + b.width, rowH); }
            ctx.fillStyle = r.color || "#444";
            ctx.font = `${r.bold ? "600 " : ""}${11 * px}px system-ui, sans-serif`;
            ctx.textAlign = "left";
            ctx.fillText(r.label, (r.indent ? 14 : 4) * px, y + rowH / 2, b.left - 8 * px);
          });
          ctx.beginPath();
          ctx.rect(b.left, b.top, b.width, b.height);
          ctx.clip();
          const cssX = (cx) => (cx - b.left) / px, cssY = (cy) => (cy - b.top) / px;
          geometry.rects = [];
          for (const s of spec.rects) {
            const inset = (s.inset || 0) * px, x = X(s.x0);
            const w = Math.max(X(s.x1) - x, px), y = rowTop(s.row) + px + inset;
            const hh = rowH - 2 * px - 2 * inset;
            ctx.fillStyle = s.color;
            ctx.fillRect(x, y, w, hh);
            ctx.strokeStyle = "#fff";
            ctx.lineWidth = 0.5 * px;
            ctx.setLineDash([]);
            if (s.outline || s.dashed) {
              ctx.strokeStyle = "#000";
              ctx.lineWidth = (s.outline ? 3 : 1.5) * px;
              if (s.dashed && !s.outline) ctx.setLineDash([3 * px, 2 * px]);
            }
            ctx.strokeRect(x, y, w, hh);
            if (s.text && w > 34 * px) {
              ctx.fillStyle = "#fff";
              ctx.textAlign = "left";
              ctx.font = `${10 * px}px system-ui, sans-serif`;
              ctx.fillText(s.text, x + 3 * px, y + hh / 2);
            }
            geometry.rects.push(Object.assign({x: cssX(x), y: cssY(y), w: w / px, h: hh / px},
              s.data || {}));
            s.box = [x / px, y / px, (x + w) / px, (y + hh) / px];
          }
          ctx.setLineDash([]);
          ctx.fillStyle = "#222";
          for (const m of spec.ticks || []) {
            const x = X(m.x), y = rowTop(m.row) + px;
            ctx.beginPath();
            ctx.moveTo(x - 4 * px, y); ctx.lineTo(x + 4 * px, y); ctx.lineTo(x, y + 7 * px);
            ctx.closePath(); ctx.fill();
            m.box = [x / px - 4, y / px, x / px + 4, y / px + 7];
          }
          ctx.strokeStyle = "#000";
          ctx.lineWidth = 2 * px;
          for (const l of spec.lines || []) {
            const x = X(l.x);
            ctx.beginPath();
            ctx.moveTo(x, rowTop(l.row0)); ctx.lineTo(x, rowTop(l.row1 + 1));
            ctx.stroke();
            l.box = [x / px - 2, rowTop(l.row0) / px, x / px + 2, rowTop(l.row1 + 1) / px];
          }
          if (spec.after) spec.after(u, ctx, px, X, rowTop);
          ctx.restore();
          geometry.plot = {left: u.over.offsetLeft, top: u.over.offsetTop,
            width: b.width / px, height: b.height / px, x: [0, spec.end]};
          el.setAttribute("data-geometry", JSON.stringify(geometry));
          if (first) { first = false; drawn(); }
        }],
        setCursor: [(u) => {
          const {left, top} = u.cursor;
          if (left === undefined || left < 0) { showTip(u, null); return; }
          const px = uPlot.pxRatio, b = u.bbox;
          const cx = left + b.left / px, cy = top + b.top / px;   // canvas CSS pixels
          const hit = (o) => o.box && cx >= o.box[0] - 1 && cx <= o.box[2] + 1 &&
            cy >= o.box[1] && cy <= o.box[3];
          // marks over lines over the innermost rectangle (drawn last)
          const found = (spec.ticks || []).find(hit) || (spec.lines || []).find(hit) ||
            [...spec.rects].reverse().find(hit) ||
            spec.rows.find((r) => r.tip && r.box && cy >= r.box[0] && cy < r.box[1]);
          showTip(u, found ? found.tip : null);
        }],
      },
    };
    charts.push(new uPlot(opts, [[0, spec.end], [null, null]], el));
  }

  function lanes(el, a) {
    // per node: a header row, then one row per lane track; the gating node first
    const rows = [], rects = [], ticks = [], lines = [];
    for (const n of a.nodes) {
      const head = rows.length;
      rows.push({label: `${n.node}${n.gating ? " \u25c0 gating" : ""}` +
        `${n.straggler ? " (straggler)" : ""}  ready ${fmt(n.ready)} s`, bold: true,
        color: n.gating ? "#d62728" : (n.straggler ? "#ff7f0e" : "#222"),
        band: n.gating ? "#fde8e8" : "#f7f7f7",
        tip: n.sources ? `<b>${esc(n.node)}</b>: bytes by source<br>` +
          n.sources.split("; ").map(esc).join("<br>") : null});
      const rowOf = {};
      n.lanes.forEach((l, li) => {
        for (let k = 0; k < l.tracks; k++) {
          rowOf[li + ":" + k] = rows.length;
          rows.push({label: l.label + (k ? ` (${k + 1})` : ""), indent: true});
        }
      });
      for (const s of n.spans) {
        const [li, track, depth, phase, st, en, status, extra, gate] = s;
        const gating = n.gating && phase === a.gating_phase && depth === 0 && gate;
        rects.push({row: rowOf[li + ":" + track], x0: st, x1: en, color: D.colors[phase],
          inset: Math.min(depth, 3) * 2.5, outline: gating, dashed: status !== "ok",
          data: {node: n.node, phase, lane: n.lanes[li].label, gating: !!gating},
          tip: `<b>${esc(phase)}</b> on ${esc(n.node)} (${esc(n.lanes[li].label)})<br>` +
            `${fmt(st)} s \u2192 ${fmt(en)} s: <b>${fmt(en - st)} s</b>` +
            (status !== "ok" ? `<br>status: ${esc(status)}` : "") +
            (extra ? "<br>" + esc(extra) : "") + (gating ? "<br><b>gating phase</b>" : "")});
      }
      for (const [li, phase, t, extra] of n.marks) {
        const row = rowOf[li + ":0"];
        if (row === undefined) continue;
        ticks.push({row, x: t, tip: `<b>${esc(phase)}</b> at ${fmt(t)} s` +
          (extra ? "<br>" + esc(extra) : "")});
      }
      if (n.ready !== null && rows.length - 1 > head)
        lines.push({x: n.ready, row0: head, row1: rows.length - 1,
          tip: `${esc(n.node)} ready at ${fmt(n.ready)} s`});
    }
    // outlines last, so that no neighbour paints over the gating phase's
    rects.sort((p, q) => (p.outline ? 1 : 0) - (q.outline ? 1 : 0));
    timeline(el, {rows, rects, ticks, lines, end: a.end, topAxis: true,
      xLabel: "seconds since the attempt's first event"});
  }

  function pathBar(el, a) {
    // the critical path as one row on the same time axis as the lanes
    timeline(el, {rows: [{label: "critical path", bold: true}], end: a.end, xLabel: "seconds",
      rowHeight: 24,
      rects: a.path.map((s) => ({row: 0, x0: s.start, x1: s.end,
        color: D.colors[s.phase] || "#ccc", data: {phase: s.phase, node: s.node},
        tip: `<b>${esc(s.phase)}</b> on ${esc(s.node)} ${esc(s.lane)}<br>` +
          `${fmt(s.start)} \u2192 ${fmt(s.end)} s: <b>${fmt(s.end - s.start)} s</b>`}))});
  }

  function compare(el, rows) {
    // per attempt (and baseline): what each pipeline held on the critical path, one scale
    const names = [...new Set(rows.flatMap((r) => Object.keys(r.shares)))];
    const end = 1.08 * Math.max(1e-9, ...rows.map((r) => r.total));
    const rects = [];
    rows.forEach((r, i) => {
      let x = 0;
      for (const p of names) {
        const v = r.shares[p];
        if (!v) continue;
        rects.push({row: i, x0: x, x1: x + v, color: D.pipeline_colors[p] || "#999",
          text: fmt(v), data: {row: r.label, pipeline: p},
          tip: `${esc(r.label)}: <b>${esc(p)}</b> ${fmt(v)} s on the critical path ` +
            `(${(100 * v / (r.total || 1)).toFixed(0)} %)`});
        x += v;
      }
    });
    timeline(el, {rows: rows.map((r) => ({label: r.label, bold: true})), rects, end,
      rowHeight: 26,
      xLabel: "seconds on the critical path to ready",
      after: (u, ctx, px, X, rowTop) => {   // the time to ready after each bar
        ctx.fillStyle = "#555";
        ctx.textAlign = "left";
        ctx.font = `${11 * px}px system-ui, sans-serif`;
        rows.forEach((r, i) => ctx.fillText(`${fmt(r.ttr)} s`, X(r.total) + 6 * px,
          (rowTop(i) + rowTop(i + 1)) / 2));
      }});
    return names;
  }

  function cdf(el, series, colors) {
    // one step line per series (time to ready, each phase) on a shared seconds axis
    const names = Object.keys(series);
    const xs = [...new Set(names.flatMap((n) => series[n]))].sort((p, q) => p - q);
    const data = [xs, ...names.map((n) => {
      const v = series[n];
      let k = 0;
      return xs.map((x) => { while (k < v.length && v[k] <= x) k++; return k / v.length; });
    })];
    const end = Math.max(1e-9, xs[xs.length - 1] || 0) * 1.02;
    const geometry = {series: names};
    pending++;
    let first = true;
    charts.push(new uPlot({
      width: W, height: 300,
      scales: {x: {time: false, auto: false, range: () => [0, end]},
        y: {auto: false, range: () => [0, 1]}},
      axes: [Object.assign({label: "seconds"}, AXIS),
        Object.assign({label: "share of nodes", size: 60,
          values: (u, splits) => splits.map((q) => `${Math.round(q * 100)}%`)}, AXIS)],
      series: [{label: "s", value: (u, v) => v === null ? "-" : fmt(v)},
        ...names.map((n) => ({label: n, stroke: colors[n], width: 2,
          paths: uPlot.paths.stepped({align: 1}), points: {show: false},
          value: (u, v) => v === null ? "-" : `${Math.round(v * 100)}%`}))],
      legend: {live: true},
      cursor: {drag: {x: false, y: false}},
      hooks: {draw: [(u) => {
        el.setAttribute("data-geometry", JSON.stringify(Object.assign(geometry,
          {plot: {width: u.bbox.width / uPlot.pxRatio, height: u.bbox.height / uPlot.pxRatio,
            x: [u.scales.x.min, u.scales.x.max]}})));
        if (first) { first = false; drawn(); }
      }]},
    }, data, el));
  }

  try {
    pending++;   // held until every chart is set up
    const phases = Object.keys(D.colors);
    legend(document.getElementById("legend-phases"), phases, D.colors);
    const total = (s) => Object.values(s).reduce((x, y) => x + y, 0);
    const rows = D.attempts.map((a) => ({label: `attempt ${a.attempt}`, shares: a.shares,
      ttr: a.ttr, total: total(a.shares)}));
    if (D.baseline) for (const b of D.baseline) rows.unshift({label: `baseline attempt ${b.attempt}`,
      shares: b.shares, ttr: b.ttr, total: total(b.shares)});
    const used = compare(document.getElementById("compare"), rows);
    legend(document.getElementById("legend-pipelines"), used, D.pipeline_colors);
    for (const a of D.attempts) {
      pathBar(document.getElementById(`path-${a.attempt}`), a);
      lanes(document.getElementById(`lanes-${a.attempt}`), a);
      const cols = Object.assign({}, D.colors, {"time to ready": "#000000"});
      if (Object.keys(a.cdf).length) cdf(document.getElementById(`cdf-${a.attempt}`), a.cdf, cols);
    }
    window.bootseerCharts = charts;
    drawn();
  } catch (e) {
    document.body.setAttribute("data-error", String(e && e.stack || e));
    throw e;
  }
})();
