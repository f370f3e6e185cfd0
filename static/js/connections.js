// Test connection (a connection's page: can its server be reached; the pipeline form:
// what its source holds) and the pipeline form's source/sink sections, whose fields
// show for the chosen type only.
"use strict";
(function () {
  function csrf(form) {
    const input = form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }
  function text(el, value) { el.textContent = value; }

  async function post(button, body) {
    const r = await fetch(button.dataset.url, {
      method: "POST", credentials: "same-origin", body: body,
      headers: { "X-CSRFToken": csrf(button.form) },
    });
    if (!r.ok) return { ok: false, message: `the server answered ${r.status}` };
    return r.json();
  }

  const testConnection = document.getElementById("test-connection");
  if (testConnection) {
    testConnection.addEventListener("click", async () => {
      const out = document.getElementById("connection-test-result");
      text(out, "testing…");
      const res = await post(testConnection, new FormData());
      out.className = res.ok ? "ok" : "error";
      text(out, res.message);
    });
  }

  const testSource = document.getElementById("test-source");
  if (testSource) {
    testSource.addEventListener("click", async () => {
      const out = document.getElementById("test-source-result");
      out.hidden = false;
      out.className = "card muted";
      out.replaceChildren(document.createTextNode("reading a sample…"));
      const res = await post(testSource, new FormData(testSource.form));
      out.className = "card " + (res.ok ? "ok" : "error");
      const lines = [res.message];
      if (res.ok && res.fields && Object.keys(res.fields).length) {
        lines.push("fields: " + Object.entries(res.fields).map(([k, v]) => `${k} ${v}`).join(", "));
      }
      if (res.backlog !== null && res.backlog !== undefined) lines.push(`backlog: ${res.backlog}`);
      if (res.rate_per_s !== null && res.rate_per_s !== undefined) {
        lines.push(`rate now: ${Math.round(res.rate_per_s)} records/s (measured over 1 s)`);
      }
      if (res.dead_in_sample) lines.push(`${res.dead_in_sample} of the sample would be dead letters`);
      out.replaceChildren(...lines.map((line) => {
        const div = document.createElement("div");
        div.textContent = line;
        return div;
      }));
      out.dataset.fields = JSON.stringify(res.fields || {});
      // The fields found, fixed in the definition on request (those of a declared type).
      const declarable = Object.fromEntries(Object.entries(res.fields || {})
        .filter(([, kind]) => ["long", "double", "string"].includes(kind)));
      if (res.ok && Object.keys(declarable).length) {
        const use = document.createElement("button");
        use.type = "button";
        use.id = "use-fields";
        use.textContent = "Use these fields";
        use.addEventListener("click", () => {
          const area = document.getElementById("id_definition");
          let doc;
          try { doc = JSON.parse(area.value); } catch (e) {
            use.replaceWith(document.createTextNode("the JSON below does not parse: " + e.message));
            return;
          }
          doc.source = Object.assign({}, doc.source || {}, { fields: declarable });
          area.value = JSON.stringify(doc, null, 2);
          use.replaceWith(document.createTextNode("fields written into the definition"));
        });
        out.appendChild(use);
      }
    });
  }

  // Show a section's fields for its type only.
  const shows = {
    source_type: { redis_stream: ["source_connection", "source_stream"],
                   jetstream: ["source_connection", "source_stream"],
                   files: ["source_path", "source_format"] },
    sink_type: { postgres: ["sink_connection", "sink_table"], parquet: ["sink_path"],
                 redis_stream: ["sink_connection", "sink_stream"] },
  };
  for (const [select, byType] of Object.entries(shows)) {
    const el = document.getElementById("id_" + select);
    if (!el) continue;
    const all = [...new Set(Object.values(byType).flat())];
    const update = () => {
      const wanted = byType[el.value] || [];
      for (const name of all) {
        const field = document.getElementById("id_" + name);
        if (field && field.closest(".field")) field.closest(".field").hidden = !wanted.includes(name);
      }
    };
    el.addEventListener("change", update);
    update();
  }
})();
