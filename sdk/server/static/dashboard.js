// The dashboard: polls /metrics once a second, parses the Prometheus text format, and draws each number
// with a small SVG chart of its last two minutes; the server summary comes once from /v1/octavo/info.
"use strict";

(function () {
  const { api, errorText, el } = window.octavo;
  const POLL_MS = 1000;
  const KEEP = 121;          // points per chart: two minutes
  const WINDOW_S = 60;       // latency percentiles over the last minute
  const SVG = "http://www.w3.org/2000/svg";
  const history = [];        // snapshots, oldest first
  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ Prometheus text format
  function parseMetrics(text) {
    const samples = [];
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
      if (!m) continue;
      const labels = {};
      if (m[2]) for (const l of m[2].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
      samples.push({ name: m[1], labels, value: parseFloat(m[3]) });
    }
    return samples;
  }
  const total = (samples, name) => samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
  function buckets(samples, name) {  // [[le, cumulative count]], le ascending (+Inf last)
    const b = samples.filter((s) => s.name === name + "_bucket").map((s) => [parseFloat(s.labels.le), s.value]);
    return b.sort((x, y) => x[0] - y[0]);
  }

  // Prometheus' histogram_quantile: linear interpolation inside the bucket holding the rank.
  function quantile(q, b) {
    if (!b.length) return null;
    const count = b[b.length - 1][1];
    if (count <= 0) return null;
    const rank = q * count;
    let prevLe = 0;
    let prevCount = 0;
    for (const [le, c] of b) {
      if (c >= rank) {
        if (!Number.isFinite(le)) return prevLe;  // in the +Inf bucket: the highest finite bound
        return c === prevCount ? le : prevLe + (le - prevLe) * (rank - prevCount) / (c - prevCount);
      }
      prevLe = le;
      prevCount = c;
    }
    return prevLe;
  }
  const minus = (now, then) => now.map(([le, c], i) => [le, c - (then[i] ? then[i][1] : 0)]);

  // ------------------------------------------------------------------ charts
  function chart(tileId, key, key2) {
    const tile = $(tileId);
    let svg = tile.querySelector("svg");
    if (!svg) {
      svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("viewBox", "0 0 120 40");
      svg.setAttribute("preserveAspectRatio", "none");
      svg.setAttribute("aria-hidden", "true");
      tile.append(svg);
    }
    const series = [key, key2].filter(Boolean).map((k) => history.map((h) => h[k]));
    const max = Math.max(1e-9, ...series.flat().filter((v) => v !== null && Number.isFinite(v)));
    const base = document.createElementNS(SVG, "line");
    base.setAttribute("class", "base");
    base.setAttribute("x1", "0"); base.setAttribute("x2", "120"); base.setAttribute("y1", "39.5"); base.setAttribute("y2", "39.5");
    const paths = series.map((values, n) => {
      const span = Math.min(KEEP, Math.max(30, values.length));  // the first 30 s fill the width faster
      const offset = span - values.length;
      let d = "";
      values.forEach((v, i) => {
        if (v === null || !Number.isFinite(v)) return;
        const x = ((offset + i) / (span - 1)) * 120;
        const y = 38 - (v / max) * 35;
        d += (d ? " L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
      });
      const p = document.createElementNS(SVG, "path");
      p.setAttribute("class", n ? "line2" : "line");
      p.setAttribute("d", d || "M0 38");
      return p;
    });
    svg.replaceChildren(base, ...paths);
  }

  // ------------------------------------------------------------------ formatting
  const pct = (v) => (v === null || !Number.isFinite(v) ? "–" : (100 * v).toFixed(1) + " %");
  const rate = (v) => (v === null ? "–" : v >= 100 ? v.toFixed(0) : v.toFixed(1));
  function secs(v) {
    if (v === null || !Number.isFinite(v)) return "–";
    return v < 1 ? (v * 1000).toFixed(v < 0.01 ? 1 : 0) + " ms" : v.toFixed(2) + " s";
  }

  // ------------------------------------------------------------------ one poll
  function snapshot(samples, t) {
    return {
      t,
      running: total(samples, "octavo:num_requests_running"),
      waiting: total(samples, "octavo:num_requests_waiting"),
      kv: total(samples, "octavo:kv_cache_usage_perc"),
      hit: total(samples, "octavo:prefix_cache_hit_rate"),
      promptTotal: total(samples, "octavo:prompt_tokens_total"),
      genTotal: total(samples, "octavo:generation_tokens_total"),
      finished: total(samples, "octavo:request_success_total"),
      ttftB: buckets(samples, "octavo:time_to_first_token_seconds"),
      itlB: buckets(samples, "octavo:time_per_output_token_seconds"),
    };
  }

  function latency(now, name) {
    // the oldest snapshot at least WINDOW_S old: percentiles over the last minute, else all time
    const old = history.find((h) => now.t - h.t >= WINDOW_S * 1000 - 500 && now.t - h.t <= (WINDOW_S + 5) * 1000);
    const windowed = old ? minus(now[name], old[name]) : null;
    const useWindow = windowed && windowed.length && windowed[windowed.length - 1][1] > 0;
    const b = useWindow ? windowed : now[name];
    return { p50: quantile(0.5, b), p90: quantile(0.9, b), p99: quantile(0.99, b), scope: useWindow ? "last minute" : "all time",
             n: b.length ? b[b.length - 1][1] : 0 };
  }

  function update(snap) {
    const prev = history[history.length - 1];
    const dt = prev ? (snap.t - prev.t) / 1000 : 0;
    snap.tpsIn = prev && dt > 0 ? Math.max(0, snap.promptTotal - prev.promptTotal) / dt : null;
    snap.tpsOut = prev && dt > 0 ? Math.max(0, snap.genTotal - prev.genTotal) / dt : null;
    const ttft = latency(snap, "ttftB");
    const itl = latency(snap, "itlB");
    Object.assign(snap, { ttft50: ttft.p50, ttft99: ttft.p99, itl50: itl.p50, itl99: itl.p99 });
    history.push(snap);
    while (history.length > KEEP) history.shift();

    $("running").textContent = String(snap.running);
    $("waiting").textContent = String(snap.waiting);
    $("kv-usage").textContent = pct(snap.kv);
    $("hit-rate").textContent = pct(snap.hit);
    $("tps-in").textContent = rate(snap.tpsIn);
    $("tps-out").textContent = rate(snap.tpsOut);
    $("tps-in-sub").textContent = "in (prefill) · " + snap.promptTotal + " total";
    $("tps-out-sub").textContent = "out (decode) · " + snap.genTotal + " total";
    $("ttft").textContent = secs(ttft.p50);
    $("ttft-sub").textContent = ttft.n ? `p90 ${secs(ttft.p90)} · p99 ${secs(ttft.p99)} · ${ttft.scope}, ${ttft.n} req` : "no request finished yet";
    $("itl").textContent = secs(itl.p50);
    $("itl-sub").textContent = itl.n ? `p90 ${secs(itl.p90)} · p99 ${secs(itl.p99)} · ${itl.scope}, ${itl.n} req` : "no request finished yet";
    $("finished").textContent = String(snap.finished);
    chart("tile-running", "running");
    chart("tile-waiting", "waiting");
    chart("tile-kv", "kv");
    chart("tile-hit", "hit");
    chart("tile-tps-in", "tpsIn");
    chart("tile-tps-out", "tpsOut");
    chart("tile-ttft", "ttft50", "ttft99");
    chart("tile-itl", "itl50", "itl99");
    chart("tile-done", "finished");
  }

  async function poll() {
    try {
      const resp = await api("/metrics");
      if (!resp.ok) throw new Error(await errorText(resp));
      update(snapshot(parseMetrics(await resp.text()), performance.now()));
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      $("updated").textContent = "cannot read /metrics: " + e.message;
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  async function loadSummary() {
    const rows = [["model", "Model"], ["architecture", "Architecture"], ["platform", "Platform"], ["device", "Device"],
                  ["attention_backend", "Attention backend"], ["dtype", "Dtype"], ["quantization", "Quantization"],
                  ["num_kv_blocks", "KV blocks"], ["block_size", "Tokens per block"], ["kv_cache_tokens", "KV-cache tokens"],
                  ["max_model_len", "Max model length"], ["max_num_seqs", "Max running requests"],
                  ["enable_prefix_caching", "Prefix caching"], ["load_time_s", "Load time (s)"], ["version", "octavo version"],
                  ["model_source", "Loaded from"]];
    const body = el("tbody");
    try {
      const resp = await api("/v1/octavo/info");
      if (!resp.ok) throw new Error(await errorText(resp));
      const info = await resp.json();
      for (const [key, label] of rows) {
        body.append(el("tr", {}, el("th", { scope: "row", text: label }), el("td", { id: "info-" + key, text: String(info[key]) })));
      }
      $("kv-sub").textContent = "of " + info.num_kv_blocks + " blocks";
    } catch (e) {
      body.append(el("tr", {}, el("td", { text: "cannot read /v1/octavo/info: " + e.message })));
    }
    $("summary").replaceChildren(body);
  }

  loadSummary().then(poll);
})();
