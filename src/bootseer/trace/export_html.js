// bootseer report page: draws the charts from the JSON in #report-data (no network, no
// library). Sets data-rendered="1" on <body> when done, data-error on a failure.
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
  const NS = "http://www.w3.org/2000/svg";
  const tip = document.getElementById("tip");
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;",
    ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const fmt = (v) => v === null || v === undefined ? "-" :
    (Math.abs(v) < 10 ? v.toFixed(2) : v.toFixed(1));
  const LABEL_W = 190, ROW = 16, W = 1180;

  function niceStep(span, n) {
    const raw = span / Math.max(n, 1), p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
    return 10 * p;
  }
  function axis(x0, x1, y, end, label, gridTop) {
    // time axis from 0 to end seconds between pixels x0..x1 at height y
    const step = niceStep(end, 10), out = [];
    out.push(`<line class="axis" x1="${x0}" x2="${x1}" y1="${y}" y2="${y}"/>`);
    for (let t = 0; t <= end + 1e-9; t += step) {
      const x = x0 + (x1 - x0) * t / end;
      if (gridTop !== undefined)
        out.push(`<line class="grid" x1="${x}" x2="${x}" y1="${gridTop}" y2="${y}"/>`);
      out.push(`<line class="axis" x1="${x}" x2="${x}" y1="${y}" y2="${y + 4}"/>` +
        `<text class="tick" x="${x}" y="${y + 15}" text-anchor="middle">${+t.toFixed(3)}</text>`);
    }
    out.push(`<text class="axis-label" x="${(x0 + x1) / 2}" y="${y + 30}" ` +
      `text-anchor="middle">${esc(label)}</text>`);
    return out.join("");
  }
  function svg(el, w, h, body) {
    el.innerHTML = `<svg xmlns="${NS}" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}">` +
      body + "</svg>";
  }
  function legend(el, names, colors) {
    el.innerHTML = names.map((n) => `<span class="key"><i style="background:${colors[n]}">` +
      `</i>${esc(n)}</span>`).join("");
  }

  // tooltips: any element with data-tip
  document.addEventListener("mousemove", (ev) => {
    const t = ev.target.closest ? ev.target.closest("[data-tip]") : null;
    if (!t) { tip.style.display = "none"; return; }
    tip.innerHTML = t.getAttribute("data-tip");
    tip.style.display = "block";
    tip.style.left = (ev.pageX + 14) + "px";
    tip.style.top = (ev.pageY + 10) + "px";
  });

  function lanes(el, a) {
    // per node: one row per lane track, the gating node first, marks and ready on top
    const rows = [];
    for (const n of a.nodes) {
      rows.push({head: n});
      n.lanes.forEach((l, li) => {
        for (let k = 0; k < l.tracks; k++) rows.push({node: n, lane: li, track: k, label: l.label});
      });
    }
    const top = 28, h = top + rows.length * ROW + 44, x0 = LABEL_W, x1 = W - 10;
    const sx = (t) => x0 + (x1 - x0) * Math.max(t, 0) / a.end;
    const out = [];
    const rowOf = new Map();
    rows.forEach((r, i) => {
      const y = top + i * ROW;
      if (r.head) {
        const n = r.head, cls = n.gating ? "node gating-node" : (n.straggler ? "node straggler" : "node");
        out.push(`<rect class="${n.gating ? "band-gating" : "band"}" x="0" y="${y}" ` +
          `width="${W}" height="${ROW}"/>`);
        out.push(`<text class="${cls}" x="4" y="${y + 12}" data-node="${esc(n.node)}">` +
          `${esc(n.node)}${n.gating ? " \u25c0 gating" : ""}${n.straggler ? " (straggler)" : ""}` +
          `  ready ${fmt(n.ready)} s</text>`);
      } else {
        rowOf.set(r.node.node + "\u0000" + r.lane + "\u0000" + r.track, y);
        out.push(`<text class="lane" x="14" y="${y + 11}">${esc(r.label)}` +
          `${r.track ? " (" + (r.track + 1) + ")" : ""}</text>`);
      }
    });
    out.push(axis(x0, x1, top + rows.length * ROW + 4, a.end, "seconds since the attempt's first event", top));
    out.push(axis(x0, x1, top - 22, a.end, "", undefined).replace(/<text class="axis-label".*?<\/text>/, ""));
    for (const n of a.nodes) {
      for (const s of n.spans) {
        const [li, track, depth, phase, st, en, status, extra] = s;
        const y = rowOf.get(n.node + "\u0000" + li + "\u0000" + track);
        const inset = Math.min(depth, 3) * 2.5, x = sx(st), w = Math.max(sx(en) - x, 1);
        const gating = n.gating && phase === a.gating_phase && depth === 0 && s[8];
        const tipText = `<b>${esc(phase)}</b> on ${esc(n.node)} (${esc(n.lanes[li].label)})<br>` +
          `${fmt(st)} s \u2192 ${fmt(en)} s: <b>${fmt(en - st)} s</b>` +
          (status !== "ok" ? `<br>status: ${esc(status)}` : "") + (extra ? "<br>" + esc(extra) : "") +
          (gating ? "<br><b>gating phase</b>" : "");
        out.push(`<rect class="span${gating ? " gating" : ""}${status !== "ok" ? " failed" : ""}" ` +
          `data-phase="${esc(phase)}" data-node="${esc(n.node)}" x="${x.toFixed(1)}" ` +
          `y="${(y + 1 + inset).toFixed(1)}" width="${w.toFixed(1)}" ` +
          `height="${(ROW - 2 - 2 * inset).toFixed(1)}" fill="${D.colors[phase]}" ` +
          `data-tip="${esc(tipText)}"/>`);
      }
      for (const [li, phase, t, extra] of n.marks) {
        const y = rowOf.get(n.node + "\u0000" + li + "\u0000" + 0);
        if (y === undefined) continue;
        const x = sx(t);
        out.push(`<path class="mark" d="M${x - 4},${y + 1} L${x + 4},${y + 1} L${x},${y + 8} Z" ` +
          `data-phase="${esc(phase)}" data-tip="${esc(`<b>${esc(phase)}</b> at ${fmt(t)} s` +
            (extra ? "<br>" + esc(extra) : ""))}"/>`);
      }
      if (n.ready !== null) {
        const ys = [...rowOf.entries()].filter(([k]) => k.startsWith(n.node + "\u0000")).map(([, y]) => y);
        if (ys.length) {
          const x = sx(n.ready);
          out.push(`<line class="ready" x1="${x}" x2="${x}" y1="${Math.min(...ys) - ROW}" ` +
            `y2="${Math.max(...ys) + ROW}" data-tip="${esc(n.node)} ready at ${fmt(n.ready)} s"/>`);
        }
      }
    }
    svg(el, W, h, out.join(""));
  }

  function pathBar(el, a) {
    // the critical path as one bar on the same time axis as the lanes
    const x0 = LABEL_W, x1 = W - 10, sx = (t) => x0 + (x1 - x0) * t / a.end, out = [];
    out.push(`<text x="4" y="17" class="node">critical path</text>`);
    for (const s of a.path) {
      const x = sx(s.start), w = Math.max(sx(s.end) - x, 1);
      out.push(`<rect class="path-seg" data-phase="${esc(s.phase)}" x="${x.toFixed(1)}" y="4" ` +
        `width="${w.toFixed(1)}" height="18" fill="${D.colors[s.phase] || "#ccc"}" ` +
        `data-tip="${esc(`<b>${esc(s.phase)}</b> on ${esc(s.node)} ${esc(s.lane)}<br>` +
          `${fmt(s.start)} \u2192 ${fmt(s.end)} s: <b>${fmt(s.end - s.start)} s</b>`)}"/>`);
    }
    out.push(axis(x0, x1, 26, a.end, "seconds", undefined));
    svg(el, W, 64, out.join(""));
  }

  function compare(el, rows) {
    // per attempt (and baseline): what each pipeline held on the critical path, one scale
    const names = [...new Set(rows.flatMap((r) => Object.keys(r.shares)))];
    const end = Math.max(1e-9, ...rows.map((r) => Object.values(r.shares).reduce((x, y) => x + y, 0)));
    const x0 = LABEL_W, x1 = W - 80, sx = (t) => (x1 - x0) * t / end, out = [];
    rows.forEach((r, i) => {
      const y = 6 + i * 26;
      let x = x0;
      out.push(`<text class="node" x="4" y="${y + 14}">${esc(r.label)}</text>`);
      for (const p of names) {
        const v = r.shares[p];
        if (!v) continue;
        const w = sx(v);
        out.push(`<rect class="share" data-pipeline="${esc(p)}" x="${x.toFixed(1)}" y="${y}" ` +
          `width="${Math.max(w, 0.5).toFixed(1)}" height="20" fill="${D.pipeline_colors[p] || "#999"}" ` +
          `data-tip="${esc(`${esc(r.label)}: <b>${esc(p)}</b> ${fmt(v)} s on the critical path ` +
            `(${(100 * v / (r.total || 1)).toFixed(0)} %)`)}"/>`);
        if (w > 34) out.push(`<text class="inbar" x="${x + 3}" y="${y + 14}">${fmt(v)}</text>`);
        x += w;
      }
      out.push(`<text class="tick" x="${x + 6}" y="${y + 14}">${fmt(r.ttr)} s</text>`);
    });
    const h = 6 + rows.length * 26;
    out.push(axis(x0, x1, h + 2, end, "seconds on the critical path to ready", undefined));
    svg(el, W, h + 40, out.join(""));
    return names;
  }

  function cdf(el, series, colors) {
    const names = Object.keys(series), H = 260, x0 = 60, x1 = W - 20, y0 = 10, y1 = H - 40;
    const end = Math.max(1e-9, ...names.flatMap((n) => series[n]));
    const sx = (t) => x0 + (x1 - x0) * t / end, sy = (q) => y1 - (y1 - y0) * q, out = [];
    for (const q of [0, 0.25, 0.5, 0.75, 1]) {
      out.push(`<line class="grid" x1="${x0}" x2="${x1}" y1="${sy(q)}" y2="${sy(q)}"/>` +
        `<text class="tick" x="${x0 - 6}" y="${sy(q) + 4}" text-anchor="end">${q * 100}%</text>`);
    }
    out.push(`<line class="axis" x1="${x0}" x2="${x0}" y1="${y0}" y2="${y1}"/>`);
    out.push(`<text class="axis-label" transform="translate(14 ${(y0 + y1) / 2}) rotate(-90)" ` +
      `text-anchor="middle">share of nodes</text>`);
    out.push(axis(x0, x1, y1, end, "seconds", undefined));
    for (const n of names) {
      const v = series[n];
      let d = `M${sx(v[0]).toFixed(1)},${sy(0)}`;
      v.forEach((x, i) => { d += ` L${sx(x).toFixed(1)},${sy(i / v.length).toFixed(1)} ` +
        `L${sx(x).toFixed(1)},${sy((i + 1) / v.length).toFixed(1)}`; });
      out.push(`<path class="cdf" d="${d}" stroke="${colors[n]}" data-phase="${esc(n)}" ` +
        `data-tip="${esc(`<b>${esc(n)}</b>: median ${fmt(v[Math.floor((v.length - 1) / 2)])} s, ` +
          `max ${fmt(v[v.length - 1])} s`)}"/>`);
    }
    svg(el, W, H, out.join(""));
  }

  try {
    const phases = Object.keys(D.colors);
    legend(document.getElementById("legend-phases"), phases, D.colors);
    const rows = D.attempts.map((a) => ({label: `attempt ${a.attempt}`, shares: a.shares,
      ttr: a.ttr, total: Object.values(a.shares).reduce((x, y) => x + y, 0)}));
    if (D.baseline) for (const b of D.baseline) rows.unshift({label: `baseline attempt ${b.attempt}`,
      shares: b.shares, ttr: b.ttr, total: Object.values(b.shares).reduce((x, y) => x + y, 0)});
    const used = compare(document.getElementById("compare"), rows);
    legend(document.getElementById("legend-pipelines"), used, D.pipeline_colors);
    for (const a of D.attempts) {
      pathBar(document.getElementById(`path-${a.attempt}`), a);
      lanes(document.getElementById(`lanes-${a.attempt}`), a);
      const cols = Object.assign({}, D.colors, {"time to ready": "#000000"});
      cdf(document.getElementById(`cdf-${a.attempt}`), a.cdf, cols);
      legend(document.getElementById(`legend-cdf-${a.attempt}`), Object.keys(a.cdf), cols);
    }
    document.body.setAttribute("data-rendered", "1");
  } catch (e) {
    document.body.setAttribute("data-error", String(e && e.stack || e));
    throw e;
  }
})();
