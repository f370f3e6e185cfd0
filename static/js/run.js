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
  const probe = { points: 0, lastBatch: -1, arrivals: [], status: null, socketOpen: false,
                  placement: null, migration: null, decisions: 0, markers: 0, alerts: 0,
                  overlaps: [] };
  const MAX_DECISIONS = 100;
  // Reconfiguration instants (epoch s), drawn as vertical lines on every time chart.
  const markerTimes = [];
  // Re-plan spans [from, to] (epoch s): the two queries' overlap (seamless) or the
  // stop-and-restart gap, shaded on every time chart (Gloss Fig. 10).
  const overlaps = [];
  const markersPlugin = {
    id: "reconfigurations",
    afterDatasetsDraw(chart) {
      const x = chart.scales.x;
      if (!x) return;
      const { ctx, chartArea } = chart;
      ctx.save();
      for (const o of overlaps) {
        if (o.to < x.min || o.from > x.max) continue;
        const left = x.getPixelForValue(Math.max(o.from, x.min));
        const right = x.getPixelForValue(Math.min(o.to, x.max));
        ctx.fillStyle = o.scheme === "seamless" ? "rgba(5, 150, 105, 0.15)"
                                                : "rgba(220, 38, 38, 0.15)";
        ctx.fillRect(left, chartArea.top, Math.max(right - left, 2),
                     chartArea.bottom - chartArea.top);
      }
      ctx.strokeStyle = "rgba(124, 58, 237, 0.55)";
      ctx.setLineDash([4, 3]);
      for (const t of markerTimes) {
        if (t < x.min || t > x.max) continue;
        const px = x.getPixelForValue(t);
        ctx.beginPath();
        ctx.moveTo(px, chartArea.top);
        ctx.lineTo(px, chartArea.bottom);
        ctx.stroke();
      }
      ctx.restore();
    },
  };
  const PALETTE = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2",
                   "#65a30d", "#dc2626", "#4b5563", "#ca8a04"];
  const FREQUENCY_LABELS = {
    cpufreq: ["DVFS (cpufreq)", "badge measured"],
    emulated: ["emulated (duty cycle)", "badge emulated"],
    cpuinfo: ["read only (/proc/cpuinfo)", "badge"],
    nominal: ["nominal (assumed)", "badge"],
  };
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
      plugins: [markersPlugin],
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
    model: lineChart("chart-model", [
      { label: "measured p95", borderColor: "#2563eb" },
      { label: "predicted a step before", borderColor: "#db2777", borderDash: [5, 3] },
      { label: "p95 bound", borderColor: "#dc2626", borderDash: [6, 4] },
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
    if (samples.length && startup.done.batch === undefined) {
      // Stages whose events are not in view (an old run's snapshot) are done too.
      for (const stage of STAGE_ORDER.slice(1, -1)) markStage(stage, null);
      markStage("batch", samples[0].t);
    }
    for (const s of samples) {
      if (s.batch_id <= probe.lastBatch) continue; // replayed after a reconnect
      probe.lastBatch = s.batch_id;
      probe.points += 1;
      if (probe.firstPointAt === undefined) probe.firstPointAt = now; // for bench_start
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
      if (s.frequency_source) setFrequencyLabel(s.frequency_source, s.frequency_ghz);
      if (s.groups) renderPlacement(s);
      renderMigration(s.migration);
      const dead = document.getElementById("dead-letter-count");
      if (dead && s.dead_letters !== null && s.dead_letters !== undefined) {
        dead.textContent = Number(s.dead_letters).toLocaleString();
        probe.deadLetters = s.dead_letters;
      }
    }
    scheduleRedraw();
  }

  function setFrequencyLabel(source, ghz) {
    const [text, cls] = FREQUENCY_LABELS[source] || [source, "badge"];
    for (const id of ["frequency-label", "frequency-chart-label"]) {
      const el = document.getElementById(id);
      el.textContent = text;
      el.className = cls;
    }
    if (ghz !== null && ghz !== undefined) {
      document.getElementById("run-frequency").textContent = Number(ghz).toFixed(2);
    }
  }

  function cell(tr, text) {
    const td = document.createElement("td");
    td.textContent = text;
    tr.appendChild(td);
  }

  // The placement of the latest batch: groups per worker, the bytes a move of them
  // reloads, their share of the measured task time, and groups that ran elsewhere.
  function renderPlacement(s) {
    const g = s.groups;
    const placement = g.placement || [];
    const ranOn = g.ran_on || [];
    const workers = [...new Set(placement.filter((e) => e !== null))]
      .sort((a, b) => a.length - b.length || (a < b ? -1 : 1));
    const colour = {};
    workers.forEach((w, i) => { colour[w] = PALETTE[i % PALETTE.length]; });
    const totalMs = (g.group_ms || []).reduce((a, b) => a + (b || 0), 0);
    const strip = document.getElementById("group-strip");
    strip.innerHTML = "";
    placement.forEach((w, i) => {
      const span = document.createElement("span");
      span.textContent = "g" + i;
      span.style.background = colour[w] || "#9ca3af";
      const drift = ranOn[i] !== null && ranOn[i] !== undefined && ranOn[i] !== w;
      if (drift) span.className = "drift";
      span.title = `group ${i} on worker ${w}` + (drift ? `, ran on ${ranOn[i]}` : "");
      strip.appendChild(span);
    });
    const tbody = document.querySelector("#placement tbody");
    tbody.innerHTML = "";
    for (const w of workers) {
      const mine = placement.map((e, i) => (e === w ? i : -1)).filter((i) => i >= 0);
      const bytes = mine.reduce((a, i) => a + ((g.group_bytes || [])[i] || 0), 0);
      const ms = mine.reduce((a, i) => a + ((g.group_ms || [])[i] || 0), 0);
      const tr = document.createElement("tr");
      tr.dataset.worker = w;
      if ((g.executor_hosts || {})[w]) tr.dataset.host = g.executor_hosts[w];
      const host = (g.executor_hosts || {})[w];
      const swatch = `\u25A0 executor ${w}` + (host ? ` on ${host}` : "");
      cell(tr, swatch);
      tr.firstChild.style.color = colour[w];
      cell(tr, mine.join(", "));
      cell(tr, (bytes / 1e6).toFixed(2) + " MB");
      cell(tr, totalMs ? Math.round((100 * ms) / totalMs) + " %" : "—");
      tbody.appendChild(tr);
    }
    // The same groups per stateful operator: each operator's partition g is group g,
    // so a group's move reloads every operator's store of it.
    const opBody = document.querySelector("#operator-state tbody");
    opBody.innerHTML = "";
    for (const op of g.operator_bytes || []) {
      const tr = document.createElement("tr");
      tr.dataset.operator = op.operator;
      const total = op.bytes.reduce((a, b) => a + (b || 0), 0);
      cell(tr, op.operator);
      cell(tr, (total / 1e6).toFixed(2) + " MB");
      cell(tr, workers.map((w) => {
        const mb = placement.reduce((a, e, i) => a + (e === w ? op.bytes[i] || 0 : 0), 0);
        return `executor ${w}: ${(mb / 1e6).toFixed(2)} MB`;
      }).join(" · "));
      opBody.appendChild(tr);
    }
    const health = document.getElementById("placement-health");
    health.textContent = `batch ${s.batch_id}: ${s.drift || 0} groups off placement, ` +
      `${s.group_moves || 0} moved since the previous batch, ${s.failed_tasks || 0} failed tasks`;
    probe.placement = { batch: s.batch_id, workers: workers.length, placement: placement,
      hosts: g.executor_hosts || {},
      operators: (g.operator_bytes || []).map((op) => op.operator) };
  }

  function renderMigration(m) {
    const el = document.getElementById("migration-state");
    probe.migration = m || null;
    if (!m) {
      el.textContent = "no migration in progress";
      el.className = "muted";
      return;
    }
    el.textContent = `migration ${m.id} in progress (${m.reason}): ${m.strategy}, ` +
      `step ${m.applied} of ${m.steps} applied`;
    el.className = "flash";
  }

  const seenDecisions = new Map();  // step -> row, so an outcome update replaces it
  const seenEvents = new Set();  // event ids drawn since the last snapshot
  let previousPrediction = null;
  function fmt(v, digits) {
    return v === null || v === undefined ? "—" : Number(v).toFixed(digits);
  }

  // Why the fleet held a decision (a guard, a plug-in, the arbiter) or took cores back
  // (the arbiter's own decisions): said in the row, not only on hover.
  function heldWhy(d) {
    if (["excluded", "vetoed", "refused"].includes(d.outcome)) return d.outcome_message;
    return d.strategy === "arbiter" ? d.reason : "";
  }

  function addDecision(d) {
    const tbody = document.querySelector("#decisions tbody");
    const known = seenDecisions.get(d.step);
    const tr = document.createElement("tr");
    tr.dataset.step = d.step;
    const c = d.cost || {};
    // The MPC prices a saturated configuration at 1e9 + its utilisation (no finite
    // latency): said as such, not as a ten-digit number.
    const qos = c.qos !== undefined && c.qos !== null && c.qos >= 1e9 ? "saturated" :
      fmt(c.qos, 2);
    const cost = c.total === undefined ? "—" :
      `${qos} / ${fmt(c.resource, 2)} / ${fmt(c.switching, 2)} / ` +
      fmt(c.transition || 0, 2);
    const cells = [new Date(d.at).toLocaleTimeString(), d.step, d.strategy,
      `${d.current.workers} → ${d.chosen.workers}`,
      `${fmt(d.current.freq_ghz, 2)} → ${fmt(d.chosen.freq_ghz, 2)}`,
      fmt(d.measured_latency_ms, 0), fmt(d.predicted_latency_ms, 0),
      d.predicted_power_w === null ? "—" : fmt(d.predicted_power_w, 1) + " W", cost,
      fmt(d.solve_ms, 2) + " ms",
      d.rebalance ? `rebalance: ${Object.keys(d.rebalance.moves).length} groups` : d.action,
      d.outcome + (heldWhy(d) ? ": " + heldWhy(d) : "")];
    for (const text of cells) cell(tr, String(text));
    tr.lastChild.className = "o-" + d.outcome;
    tr.lastChild.title = d.outcome_message || d.reason || "";
    tr.title = d.reason || "";
    if (known) {
      tbody.replaceChild(tr, known);
    } else {
      tbody.insertBefore(tr, tbody.firstChild);
      probe.decisions += 1;
      // Predicted-vs-measured: this step's measurement against last step's prediction.
      push(charts.model, 0, d.t, d.measured_latency_ms);
      push(charts.model, 1, d.t, previousPrediction);
      push(charts.model, 2, d.t, latencyBound);
      previousPrediction = d.predicted_latency_ms;
      (d.alerts || []).forEach((a) => showAlert(a, d.at));
    }
    seenDecisions.set(d.step, tr);
    while (tbody.children.length > MAX_DECISIONS) {
      const last = tbody.lastChild;
      seenDecisions.delete(Number(last.dataset.step));
      tbody.removeChild(last);
    }
    if (d.action !== "hold" && (d.outcome === "applied" || d.outcome === "pending")) {
      addMarker(d.t);
    }
    const m = d.mape || {};
    document.getElementById("model-error").textContent =
      `model error (MAPE over the run): latency ${fmt(m.latency, 1)} %, throughput ` +
      `${fmt(m.throughput, 1)} %, ` +
      (m.power === null || m.power === undefined
        ? "power not measured (modelled: no error to show)"
        : `power ${fmt(m.power, 1)} %`) +
      (m.latency > 50 ? " — treat predictions with caution" : "");
    scheduleRedraw();
  }

  function addMarker(t) {
    if (markerTimes.some((x) => Math.abs(x - t) < 0.5)) return;
    markerTimes.push(t);
    if (markerTimes.length > 200) markerTimes.shift();
    probe.markers = markerTimes.length;
  }

  function showAlert(text, at) {
    const box = document.getElementById("alerts");
    const div = document.createElement("div");
    div.className = "flash error alert";
    div.textContent = `${new Date(at).toLocaleTimeString()} — ${text}`;
    box.insertBefore(div, box.firstChild);
    while (box.children.length > 5) box.removeChild(box.lastChild);
    probe.alerts += 1;
  }

  // Start-up stages, from the audited events (the snapshot's, then live ones) and the
  // first sample: each stage shows the seconds since the run was created.
  const STAGE_OF = { created: "created", "runner:runner_started": "runner",
    "runner:session_started": "session", "runner:executors_ready": "executors",
    "runner:query_started": "query" };
  const STAGE_ORDER = ["created", "runner", "session", "executors", "query", "batch"];
  const startup = { createdAt: null, done: {} };
  probe.startup = startup.done;
  function markStage(stage, atSeconds) {
    if (!document.getElementById("startup") || startup.done[stage] !== undefined) return;
    if (stage === "created") startup.createdAt = atSeconds;
    const since = startup.createdAt === null || atSeconds === null ? null
      : Math.max(0, atSeconds - startup.createdAt);
    startup.done[stage] = since;
    const li = document.querySelector(`#startup li[data-stage="${stage}"]`);
    if (li) {
      li.classList.add("done");
      if (since !== null) li.dataset.after = `${since.toFixed(1)} s`;
    }
    const next = STAGE_ORDER.find((s) => startup.done[s] === undefined);
    const current = document.querySelector("#startup li.current");
    if (current) current.classList.remove("current");
    const summary = document.getElementById("startup-summary");
    if (next) {
      const nextLi = document.querySelector(`#startup li[data-stage="${next}"]`);
      if (nextLi) nextLi.classList.add("current");
      summary.textContent = "starting…";
    } else {
      summary.textContent = since !== null ? `first batch ${since.toFixed(1)} s after Start` : "";
    }
  }

  function addEvent(e) {
    // A push that the snapshot already held arrives again after it.
    if (e.id !== undefined) {
      if (seenEvents.has(e.id)) return;
      seenEvents.add(e.id);
    }
    if (STAGE_OF[e.kind]) markStage(STAGE_OF[e.kind], Date.parse(e.at) / 1000);
    const tbody = document.querySelector("#events tbody");
    const tr = document.createElement("tr");
    for (const text of [new Date(e.at).toLocaleTimeString(), e.kind, e.actor, e.message]) {
      const td = document.createElement("td");
      td.textContent = text || "";
      tr.appendChild(td);
    }
    tbody.insertBefore(tr, tbody.firstChild);
    while (tbody.children.length > MAX_EVENTS) tbody.removeChild(tbody.lastChild);
    // Operator and runner reconfigurations are markers too (the controller's come
    // from its decisions).
    if (e.kind === "runner:replan_done" && e.payload && e.payload.overlap_from) {
      const p = e.payload;
      if (!overlaps.some((o) => o.from === p.overlap_from)) {
        overlaps.push({ from: p.overlap_from, to: p.overlap_to, scheme: p.scheme });
        probe.overlaps = overlaps.map((o) => Object.assign({}, o));
      }
      scheduleRedraw();
    }
    if (e.kind === "runner:workers_changed" || e.kind === "runner:frequency_changed" ||
        e.kind === "runner:migration_done" || e.kind === "runner:replan_switched") {
      addMarker(Date.parse(e.at) / 1000);
      scheduleRedraw();
    }
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
    if (run.frequency_source) setFrequencyLabel(run.frequency_source, run.frequency_ghz);
    setVerification(run.verification);
  }

  // The exactly-once badge: its text and class come from the server
  // (pipelines.models.verification_badge), as the page first drew it.
  function setVerification(v) {
    const badge = document.getElementById("run-verification");
    if (!badge) return;
    badge.textContent = v ? v.badge : "not checked";
    badge.className = "badge " + (v ? v.css : "v-none");
    badge.title = (v && v.line) || "";
    document.getElementById("run-verification-line").textContent = (v && v.line) || "";
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
        seenEvents.clear();
        data.events.forEach(addEvent);
        (data.decisions || []).forEach(addDecision);
        addSamples(data.samples, false);
      } else if (data.kind === "metrics") {
        addSamples(data.samples, true);
      } else if (data.kind === "event") {
        addEvent(data.event);
      } else if (data.kind === "decision") {
        addDecision(data.decision);
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
      // Jittered: after a restart of the server every open page reconnects, and spread
      // over the backoff their connect handlers do not all queue at once.
      setTimeout(connect, backoff * (0.5 + Math.random()));
      backoff = Math.min(backoff * 2, 10000);
    };
  }
  connect();
})();
