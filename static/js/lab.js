// Strategy Lab result page: follow a running comparison's progress (polling its status),
// then draw the comparison charts and make the summary table sortable.
(function () {
  "use strict";
  const labId = JSON.parse(document.getElementById("lab-id").textContent);
  const state = JSON.parse(document.getElementById("lab-state").textContent);
  const probe = (window.__streamwiseLab = { progress: [], charts: 0, sorted: null });

  if (state === "pending" || state === "running") {
    const bar = document.getElementById("lab-progress");
    const label = document.getElementById("lab-percent");
    const poll = async () => {
      try {
        const r = await fetch(`/lab/${labId}/status.json`, { credentials: "same-origin" });
        const s = await r.json();
        bar.value = s.percent;
        label.textContent = `${s.percent} %`;
        probe.progress.push(s.percent);
        if (s.status === "done" || s.status === "failed") { window.location.reload(); return; }
      } catch (e) { /* a transient error: try again */ }
      setTimeout(poll, 400);
    };
    poll();
    return;
  }
  const resultNode = document.getElementById("lab-result");
  if (!resultNode) return;
  const result = JSON.parse(resultNode.textContent);
  const palette = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2",
                   "#db2777", "#65a30d", "#475569", "#ea580c", "#4f46e5", "#0d9488"];
  const steps = [...Array(result.steps).keys()].map((t) => t * result.step_s);

  function chart(id, datasets, yTitle) {
    probe.charts += 1;
    return new Chart(document.getElementById(id), {
      type: "line",
      data: { labels: steps, datasets },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        elements: { point: { radius: 0 }, line: { borderWidth: 1.5 } },
        interaction: { mode: "index", intersect: false },
        scales: { x: { title: { display: true, text: "s" }, ticks: { maxTicksLimit: 10 } },
                  y: { title: { display: true, text: yTitle } } },
        plugins: { legend: { labels: { boxWidth: 10 } } },
      },
    });
  }
  const per = (field, opts = {}) => result.results.map((r, i) => ({
    label: r.label, data: r.series[field], borderColor: palette[i % palette.length],
    backgroundColor: palette[i % palette.length], stepped: opts.stepped || false,
  }));
  const rate = [{ label: "rate", data: result.results[0].series.rate, borderColor: "#111827",
                  backgroundColor: "#111827", borderWidth: 2 }];
  result.results.forEach((r, i) => {
    if (r.series.forecast.some((v) => v !== null)) {
      rate.push({ label: `${r.label} forecast`, data: r.series.forecast, borderDash: [4, 3],
                  borderColor: palette[i % palette.length], backgroundColor: palette[i % palette.length] });
    }
  });
  chart("chart-rate", rate, "tuples/s");
  chart("chart-workers", per("workers", { stepped: true }), "workers");
  chart("chart-freq", per("freq_ghz", { stepped: true }), "GHz");
  const bound = result.latency_bound_ms;
  chart("chart-latency", [...per("latency_ms"),
    { label: "bound", data: steps.map(() => bound), borderColor: "#991b1b", borderDash: [6, 4],
      backgroundColor: "#991b1b" }], "ms");
  chart("chart-power", per("power_w"), "W (modelled)");

  // Sortable summary: click a header; numbers sort numerically, text alphabetically.
  const table = document.getElementById("lab-summary");
  table.querySelectorAll("th").forEach((th, col) => {
    if (th.dataset.type === "none") return;
    th.style.cursor = "pointer";
    th.addEventListener("click", () => {
      const asc = th.dataset.dir !== "asc";
      table.querySelectorAll("th").forEach((h) => delete h.dataset.dir);
      th.dataset.dir = asc ? "asc" : "desc";
      const rows = [...table.tBodies[0].rows];
      const key = (tr) => {
        const text = tr.cells[col].textContent.trim();
        const num = parseFloat(text);
        return th.dataset.type === "text" || Number.isNaN(num) ? text : num;
      };
      rows.sort((a, b) => {
        const x = key(a), y = key(b);
        const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return asc ? c : -c;
      });
      rows.forEach((tr) => table.tBodies[0].appendChild(tr));
      probe.sorted = { col, asc };
    });
  });
})();
