// Run page: live charts fed by the run's WebSocket (snapshot, then pushed samples).
// Charts keep a bounded window and redraw at most every REDRAW_MS, however fast
// samples arrive.
(function () {
  "use strict";
  const MAX_POINTS = 300;
  const REDRAW_MS = 250;
  const MAX_EVENTS = 200;
  const runId = JSON.parse(document.getElementById("run-id").textContent);
  const latencyBound = JSON.parse(document.getElementById("latency-bound").textContent);
  const powerBudget = JSON.parse(document.getElementById("power-budget").textContent);

  // Exposed for the browser test and the push-latency benchmark.
  const probe = { points: 0, lastBatch: -1, arrivals: [], status: null, socketOpen: false };
  window.__streamwise = probe;

  const timeTick = (v) => new Date(v * 1000).toLocaleTimeString();
  function lineChart(id, datasets, extraScales) {
    return new Chart(document.getElementById(id), {
      type: "line",
      data: { datasets: datasets.map((d) => Object.assign(
        { data: [], pointRadius: 0, borderWidth: 1.6, tension: 0, parsing: false }, d)) },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, normalized: true,
        interaction: { mode: "nearest", intersect: false },
        scales: Object.assign({ x: { type: "linear", ticks: { callback: timeTick, maxTicksLimit: 6 } },
                                 y: { beginAtZero: true } }, extraScales || {}),
        plugins: { legend: { labels: { boxWidth: 12 } } },
      },
    });
  }
  const charts = {
    latency: lineChart("chart-latency", [
      { label: "p50", borderColor: "#60a5fa" },
      { label: "p95", borderColor: "#2563eb" },
      { label: "p99", borderColor: "#7c3aed" },
      { label: "p95 bound", borderColor: "#dc2626", borderDash: [6, 4] },
    ]),
    rate: lineChart("chart-rate", [
      { label: "input (Spark)", borderColor: "#059669" },
      { label: "scheduled", borderColor: "#9ca3af", borderDash: [3, 3] },
      { label: "output (sink)", borderColor: "#d97706" },
    ]),
    config: lineChart("chart-config", [
      { label: "workers", borderColor: "#2563eb", stepped: true, yAxisID: "y" },
      { label: "CPU GHz", borderColor: "#db2777", yAxisID: "y1" },
    ], { y: { beginAtZero: true, grace: "20%", ticks: { precision: 0 } },
         y1: { position: "right", beginAtZero: true, grace: "20%",
               grid: { drawOnChartArea: false } } }),
    power: lineChart("chart-power", [
      { label: "power", borderColor: "#ea580c" },
      { label: "budget", borderColor: "#dc2626", borderDash: [6, 4] },
    ]),
  };

  function push(chart, index, x, y) {
    const data = chart.data.datasets[index].data;
    data.push({ x: x, y: y === undefined ? null : y });
    if (data.length > MAX_POINTS) data.splice(0, data.length - MAX_POINTS);
  }

  let redrawTimer = null;
  function scheduleRedraw() {
    if (redrawTimer !== null) return;
    redrawTimer = setTimeout(() => {
      redrawTimer = null;
      for (const c of Object.values(charts)) c.update("none");
    }, REDRAW_MS);
  }

  function addSamples(samples, live) {
    const now = Date.now() / 1000;
    for (const s of samples) {
      if (s.batch_id <= probe.lastBatch) continue; // replayed after a reconnect
      probe.lastBatch = s.batch_id;
      probe.points += 1;
      if (live && s.written_at) {
        probe.arrivals.push({ batch: s.batch_id, written_at: s.written_at, received_at: now });
        if (probe.arrivals.length > 1000) probe.arrivals.shift();
      }
      const x = s.t;
      push(charts.latency, 0, x, s.latency_p50_ms);
      push(charts.latency, 1, x, s.latency_p95_ms);
      push(charts.latency, 2, x, s.latency_p99_ms);
      push(charts.latency, 3, x, latencyBound);
      push(charts.rate, 0, x, s.input_rate);
      push(charts.rate, 1, x, s.scheduled_rate);
      push(charts.rate, 2, x, s.output_rate);
      push(charts.config, 0, x, s.workers);
      push(charts.config, 1, x, s.frequency_ghz);
      push(charts.power, 0, x, s.power_w);
      push(charts.power, 1, x, powerBudget);
      const label = document.getElementById("power-label");
      label.textContent = s.power_measured ? "measured" : "modelled";
      label.className = "badge" + (s.power_measured ? " measured" : "");
    }
    scheduleRedraw();
  }

  function addEvent(e) {
    const tbody = document.querySelector("#events tbody");
    const tr = document.createElement("tr");
    for (const text of [new Date(e.at).toLocaleTimeString(), e.kind, e.actor, e.message]) {
      const td = document.createElement("td");
      td.textContent = text || "";
      tr.appendChild(td);
    }
    tbody.insertBefore(tr, tbody.firstChild);
    while (tbody.children.length > MAX_EVENTS) tbody.removeChild(tbody.lastChild);
  }

  function setStatus(run) {
    probe.status = run.status;
    const el = document.getElementById("run-status");
    el.textContent = run.status;
    el.className = "status s-" + run.status;
    document.getElementById("run-reason").textContent = run.reason || "";
    document.getElementById("run-workers").textContent = run.workers;
    document.getElementById("run-key-groups").textContent = run.key_groups;
    document.getElementById("run-app").textContent = run.spark_app_id || "—";
  }

  let backoff = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws/runs/${runId}/`);
    const live = document.getElementById("live-state");
    ws.onopen = () => { probe.socketOpen = true; backoff = 500; live.textContent = "live"; };
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (data.kind === "snapshot") {
        setStatus(data.run);
        document.querySelector("#events tbody").innerHTML = "";
        data.events.forEach(addEvent);
        addSamples(data.samples, false);
      } else if (data.kind === "metrics") {
        addSamples(data.samples, true);
      } else if (data.kind === "event") {
        addEvent(data.event);
      } else if (data.kind === "status") {
        setStatus(data.run);
      }
    };
    ws.onclose = (ev) => {
      probe.socketOpen = false;
      if (ev.code === 4401 || ev.code === 4404) {
        live.textContent = ev.code === 4401 ? "not logged in" : "run not found";
        return;
      }
      live.textContent = "reconnecting…";
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 10000);
    };
  }
  connect();
})();
