// Tail latency tab: the parts a Locust extended table cannot hold (run header, server chart, report link).
// Locust renders the tab and its stage table; this script adds a panel above that table while the tab is
// shown, from ./tailgate/live, polled every POLL_MS whether or not Locust still polls (it stops at the end
// of a run, but the report is built after it).
(function () {
  "use strict";
  var TAB = "tail-latency";
  var POLL_MS = 2000;
  var ANCHOR_TITLE = "Planned / sent / recorded";
  var last = null;
  var timer = null;

  function onTab() {
    return new URLSearchParams(window.location.search).get("tab") === TAB;
  }

  function anchor() {
    var heads = document.querySelectorAll("th");
    for (var i = 0; i < heads.length; i++) {
      if (heads[i].textContent === ANCHOR_TITLE) {
        var table = heads[i].closest("table");
        return table && (table.closest(".MuiTableContainer-root") || table);
      }
    }
    return null;
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svgEl(tag, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }

  function fmtS(s) {
    return s < 120 ? s.toFixed(0) + " s" : (s / 60).toFixed(1) + " min";
  }

  function chart(series) {
    var W = 720, H = 150, L = 40, R = 44, T = 10, B = 22;
    var svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, class: "tg-chart", role: "img",
      "aria-label": "server series: running, waiting, KV cache usage, preemptions" });
    var t = series.t || [];
    if (t.length < 2) {
      var msg = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "tg-axis" });
      msg.textContent = t.length ? "waiting for server samples…" : "no server samples (/metrics not read, or a Prometheus scrapes it)";
      svg.appendChild(msg);
      return svg;
    }
    var t0 = t[0], t1 = t[t.length - 1];
    var counts = (series.running || []).concat(series.waiting || []).filter(function (v) { return v !== null; });
    var ymax = Math.max(1, Math.max.apply(null, counts.length ? counts : [1]));
    var x = function (v) { return L + (W - L - R) * (v - t0) / Math.max(1e-9, t1 - t0); };
    var yc = function (v) { return H - B - (H - B - T) * v / ymax; };
    var yk = function (v) { return H - B - (H - B - T) * v; };
    svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "tg-grid" }));
    svg.appendChild(svgEl("line", { x1: L, y1: T, x2: W - R, y2: T, class: "tg-grid" }));
    function label(xp, yp, anchorPos, text) {
      var e = svgEl("text", { x: xp, y: yp, "text-anchor": anchorPos, class: "tg-axis" });
      e.textContent = text;
      svg.appendChild(e);
    }
    label(L - 4, T + 4, "end", String(ymax));
    label(L - 4, H - B + 4, "end", "0");
    label(W - R + 4, T + 4, "start", "100%");
    label(W - R + 4, H - B + 4, "start", "0%");
    label(L, H - 6, "start", fmtS(t0));
    label(W - R, H - 6, "end", fmtS(t1));
    function line(values, scale, cls) {
      var pts = [];
      for (var i = 0; i < t.length; i++) {
        if (values[i] !== null && values[i] !== undefined) pts.push(x(t[i]).toFixed(1) + "," + scale(values[i]).toFixed(1));
      }
      if (pts.length) svg.appendChild(svgEl("polyline", { points: pts.join(" "), class: cls }));
    }
    line(series.running || [], yc, "tg-running");
    line(series.waiting || [], yc, "tg-waiting");
    line(series.kv_usage || [], yk, "tg-kv");
    var pre = series.preemptions_total || [];
    for (var i = 1; i < t.length; i++) {
      if (pre[i] !== null && pre[i - 1] !== null && pre[i] > pre[i - 1]) {
        svg.appendChild(svgEl("circle", { cx: x(t[i]).toFixed(1), cy: H - B - 4, r: 3.5, class: "tg-preempt" }));
      }
    }
    return svg;
  }

  function latencyChart(lat) {
    // each finished request: its TTFT and worst gap at the moment it ended (newest requests only)
    var W = 720, H = 150, L = 48, R = 12, T = 10, B = 22;
    var svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, class: "tg-chart", id: "tailgate-latency-chart",
      role: "img", "aria-label": "TTFT and worst gap of each request over time" });
    var t = (lat && lat.t) || [];
    if (!t.length) {
      var msg = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "tg-axis" });
      msg.textContent = "no finished request yet";
      svg.appendChild(msg);
      return svg;
    }
    var vals = lat.ttft.concat(lat.gap).filter(function (v) { return v !== null && v !== undefined; });
    var ymax = Math.max(1, Math.max.apply(null, vals.length ? vals : [1]));
    var t0 = t[0], t1 = Math.max(t[t.length - 1], t0 + 1e-6);
    var x = function (v) { return L + (W - L - R) * (v - t0) / (t1 - t0); };
    var y = function (v) { return H - B - (H - B - T) * v / ymax; };
    svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "tg-grid" }));
    function label(xp, yp, anchorPos, text) {
      var e = svgEl("text", { x: xp, y: yp, "text-anchor": anchorPos, class: "tg-axis" });
      e.textContent = text;
      svg.appendChild(e);
    }
    label(L - 4, T + 4, "end", ymax.toFixed(0) + " ms");
    label(L - 4, H - B + 4, "end", "0");
    label(L, H - 6, "start", fmtS(t0));
    label(W - R, H - 6, "end", fmtS(t1));
    var drawn = 0;
    [["ttft", "tg-ttft"], ["gap", "tg-gap"]].forEach(function (m) {
      // one path of round dots per metric: a few elements however many requests, cheap to re-render
      var values = lat[m[0]] || [], d = [];
      for (var i = 0; i < t.length; i++) {
        if (values[i] === null || values[i] === undefined) continue;
        d.push("M" + x(t[i]).toFixed(1) + " " + y(values[i]).toFixed(1) + "h0");
        drawn++;
      }
      if (d.length) svg.appendChild(svgEl("path", { d: d.join(""), class: m[1] + " tg-dots" }));
    });
    svg.setAttribute("data-points", String(drawn));
    return svg;
  }

  function latencyLegend() {
    var box = el("div", { class: "tg-legend" });
    [["tg-ttft", "TTFT"], ["tg-gap", "worst gap between chunks"]].forEach(function (p) {
      var item = el("span", { class: "tg-key" });
      item.appendChild(el("span", { class: "tg-swatch " + p[0] }));
      item.appendChild(document.createTextNode(p[1]));
      box.appendChild(item);
    });
    return box;
  }

  function downloads(run) {
    var box = el("div", { class: "tg-downloads", id: "tailgate-downloads" }, "Download: ");
    [["records", "records and send journals"], ["summaries", "summaries and run.json"], ["report", "report"]]
      .forEach(function (d, i) {
        if (d[0] === "report" && run.report.state !== "ready") return;
        if (i) box.appendChild(document.createTextNode(" · "));
        box.appendChild(el("a", { href: "./tailgate/download/" + run.run_id + "/" + d[0],
          id: "tailgate-download-" + d[0] }, d[1]));
      });
    return box;
  }

  function legend(series) {
    var pre = (series.preemptions_total || []).filter(function (v) { return v !== null; });
    var since = pre.length ? pre[pre.length - 1] - pre[0] : null;
    var box = el("div", { class: "tg-legend" });
    [["tg-running", "running"], ["tg-waiting", "waiting"], ["tg-kv", "KV cache usage (right axis)"],
     ["tg-preempt", "preemption" + (since === null ? "" : " (" + since + " this run)")]].forEach(function (p) {
      var item = el("span", { class: "tg-key" });
      item.appendChild(el("span", { class: "tg-swatch " + p[0] }));
      item.appendChild(document.createTextNode(p[1]));
      box.appendChild(item);
    });
    return box;
  }

  function render(data) {
    var panel = el("div", { id: "tailgate-panel" });
    var run = data && data.run;
    if (!run) {
      panel.appendChild(el("div", { class: "tg-head" }, "No run yet: press Start."));
      return panel;
    }
    var head = el("div", { class: "tg-head" });
    head.appendChild(el("b", {}, "Run " + run.run_id));
    var state = run.ended ? run.status : (run.current_stage ? "running " + run.current_stage : "starting");
    head.appendChild(document.createTextNode(" · " + run.arm + " · "));
    head.appendChild(el("span", { class: "tg-status", "data-status": run.status }, state));
    head.appendChild(document.createTextNode(" · " + fmtS(run.elapsed_s) + " · " + run.host + " · " + run.model));
    panel.appendChild(head);
    panel.appendChild(el("div", { class: "tg-note" },
      "Exact percentiles from the records, warm-up excluded (" + run.warmup_rule + " rule, " + run.warmup +
      " per stage) as in the stage summaries; Locust's Statistics tab rounds response times into buckets. " +
      "Results: " + run.folder));
    var rep = el("div", { class: "tg-report", "data-state": run.report.state });
    if (run.report.state === "ready") {
      rep.appendChild(document.createTextNode("Report: "));
      rep.appendChild(el("a", { href: "./tailgate/report/" + run.run_id, target: "_blank", id: "tailgate-report-link" },
        "open the HTML report of run " + run.run_id));
    } else if (run.report.state === "building") {
      rep.textContent = "Report: building (in its own process)…";
    } else if (run.report.state === "failed") {
      rep.textContent = "Report failed: " + (run.report.error || "see report.log in the results folder");
    } else {
      rep.textContent = run.ended ? "" : "Report: built when the run ends.";
    }
    panel.appendChild(rep);
    panel.appendChild(downloads(run));
    panel.appendChild(el("div", { class: "tg-title" }, "Requests: TTFT and worst gap as each ended"));
    panel.appendChild(latencyChart(run.latency));
    panel.appendChild(latencyLegend());
    var series = run.series || {};
    panel.appendChild(el("div", { class: "tg-title" }, "Server (direct /metrics samples)"));
    panel.appendChild(chart(series));
    panel.appendChild(legend(series));
    if (data.earlier && data.earlier.length) {
      var prev = el("div", { class: "tg-earlier" }, "Earlier runs: ");
      data.earlier.forEach(function (r, i) {
        if (i) prev.appendChild(document.createTextNode(" · "));
        if (r.report === "ready") {
          prev.appendChild(el("a", { href: "./tailgate/report/" + r.run_id, target: "_blank" }, r.run_id));
        } else {
          prev.appendChild(document.createTextNode(r.run_id));
        }
        prev.appendChild(document.createTextNode(" " + r.status));
      });
      panel.appendChild(prev);
    }
    return panel;
  }

  function place() {
    var old = document.getElementById("tailgate-panel");
    var where = onTab() ? anchor() : null;
    if (!where) {
      if (old) old.remove();
      return;
    }
    var panel = render(last);
    if (old) old.replaceWith(panel);
    where.parentNode.insertBefore(panel, where);
    markRows();
  }

  function poll(always) {
    if (!onTab() && !always) {
      place();
      return;
    }
    fetch("./tailgate/live", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) { last = data; } place(); })
      .catch(function () { place(); });
  }

  var pending = false;
  new MutationObserver(function () {
    // Locust re-renders the tab; put the panel back above its table (and only on this tab)
    if (pending) return;
    pending = true;
    window.requestAnimationFrame(function () {
      pending = false;
      var panel = document.getElementById("tailgate-panel");
      var where = onTab() ? anchor() : null;
      if ((panel && !where) || (where && (!panel || panel.nextSibling !== where))) {
        if (where && !last) poll(); else place();
      }
    });
  }).observe(document.body, { childList: true, subtree: true });

  // A Start answered: the new run exists already (the server opens it before answering), so the panel shows
  // it now instead of at its next poll, and the stage rows, which ride on Locust's own stats poll, are hidden
  // until a stats answer asked for after the Start arrives: never the previous run's rows under the new run.
  var startedAt = 0;
  var staleRows = false;
  function markRows() {
    var table = anchor();
    if (!table) return;
    if (staleRows) table.setAttribute("data-tg-stale", "1"); else table.removeAttribute("data-tg-stale");
  }
  var realFetch = window.fetch ? window.fetch.bind(window) : null;
  if (realFetch) {
    window.fetch = function (input, init) {
      var issued = Date.now();
      var done = realFetch(input, init);
      var url = (typeof input === "string" ? input : (input && input.url) || "").split("?")[0];
      var method = String((init && init.method) || (input && input.method) || "GET").toUpperCase();
      if (method === "POST" && /\/swarm$/.test(url)) {
        done.then(function (r) {
          if (!r.ok) return;
          startedAt = Date.now();
          staleRows = true;
          markRows();
          poll(true);  // on the tab or not: whoever opens it next must not see the previous run's answer
        }, function () {});
      } else if (/\/stats\/requests$/.test(url)) {
        done.then(function () {
          if (staleRows && issued >= startedAt) {
            staleRows = false;
            window.requestAnimationFrame(markRows);
          }
        }, function () {});
      }
      return done;
    };
  }

  timer = window.setInterval(poll, POLL_MS);
  poll();
})();
