// The chat page: model picker, settings, streaming replies over SSE, stop (aborting the fetch closes the
// connection, and the server aborts the request), retry, copy, and the conversation in localStorage.
"use strict";

(function () {
  const { api, errorText, el } = window.octavo;
  const CHAT_STORE = "octavo.chat";
  const SETTINGS_STORE = "octavo.settings";
  const $ = (id) => document.getElementById(id);
  const ui = {
    model: $("model"), system: $("system"), temperature: $("temperature"), topP: $("top-p"),
    maxTokens: $("max-tokens"), messages: $("messages"), prompt: $("prompt"), send: $("send"),
    stop: $("stop"), status: $("status"), form: $("composer"), newChat: $("new-chat"), empty: $("empty"),
  };
  let conversation = load(CHAT_STORE, []);  // [{role, content, meta}]
  let controller = null;                    // the AbortController of the reply being streamed

  function load(key, fallback) {
    try { return JSON.parse(localStorage.getItem(key)) || fallback; } catch (e) { return fallback; }
  }
  function save() {
    try {
      localStorage.setItem(CHAT_STORE, JSON.stringify(conversation));
      localStorage.setItem(SETTINGS_STORE, JSON.stringify({
        model: ui.model.value, system: ui.system.value, temperature: ui.temperature.value,
        topP: ui.topP.value, maxTokens: ui.maxTokens.value,
      }));
    } catch (e) { /* storage full or disabled: the page still works */ }
  }
  function restoreSettings() {
    const s = load(SETTINGS_STORE, {});
    if (s.system !== undefined) ui.system.value = s.system;
    if (s.temperature) ui.temperature.value = s.temperature;
    if (s.topP) ui.topP.value = s.topP;
    if (s.maxTokens) ui.maxTokens.value = s.maxTokens;
    return s.model;
  }

  async function loadModels() {
    const wanted = restoreSettings();
    try {
      const resp = await api("/v1/models");
      if (!resp.ok) { setStatus("Could not list models: " + (await errorText(resp))); return; }
      const data = (await resp.json()).data || [];
      ui.model.replaceChildren(...data.map((m) => el("option", { value: m.id, text: m.id })));
      if (data.some((m) => m.id === wanted)) ui.model.value = wanted;
      setStatus(data.length ? "" : "The server lists no model.");
    } catch (e) {
      setStatus("Could not reach the server: " + e.message);
    }
  }

  function setStatus(text) { ui.status.textContent = text; }

  // ------------------------------------------------------------------ rendering
  function render() {
    ui.messages.replaceChildren();
    if (!conversation.length) ui.messages.append(ui.empty);
    conversation.forEach((m, i) => ui.messages.append(messageNode(m, i)));
    ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  function messageNode(m, i) {
    const node = el("article", { class: "msg " + m.role, "data-index": String(i) });
    node.append(el("div", { class: "role", text: m.role === "user" ? "You" : m.role === "error" ? "Error" : "Model" }));
    const body = el("div", { class: "body" });
    if (m.role === "assistant") body.append(window.renderMarkdown(m.content));
    else body.textContent = m.content;
    if (m.streaming) body.classList.add("cursor");
    node.append(body);
    if (m.meta) node.append(el("div", { class: "meta", text: m.meta }));
    if (m.role === "assistant" && !m.streaming) {
      const actions = el("div", { class: "actions" });
      const copy = el("button", { type: "button", class: "small copy", "aria-label": "Copy reply " + (i + 1) }, "Copy");
      copy.addEventListener("click", () => copyText(m.content, copy));
      actions.append(copy);
      if (i === conversation.length - 1) {
        const retry = el("button", { type: "button", class: "small retry", "aria-label": "Retry the last reply" }, "Retry");
        retry.addEventListener("click", () => { conversation.pop(); render(); generate(); });
        actions.append(retry);
      }
      node.append(actions);
    }
    return node;
  }

  function updateStreaming(m) {
    const node = ui.messages.lastElementChild;
    const body = node && node.querySelector(".body");
    if (!body) { render(); return; }
    body.replaceChildren(window.renderMarkdown(m.content));
    ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  async function copyText(text, button) {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch (e) {  // no clipboard permission (plain http, not localhost): select the text instead
      const range = document.createRange();
      range.selectNodeContents(button.closest(".msg").querySelector(".body"));
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      button.textContent = "Selected: press Ctrl+C";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  }

  // ------------------------------------------------------------------ generation
  function numberOrNull(input, parse) {
    const v = parse(input.value);
    return Number.isFinite(v) ? v : null;
  }

  function requestBody() {
    const messages = [];
    if (ui.system.value.trim()) messages.push({ role: "system", content: ui.system.value });
    for (const m of conversation) {
      if (m.role === "user" || (m.role === "assistant" && m.content)) messages.push({ role: m.role, content: m.content });
    }
    const body = { model: ui.model.value || undefined, messages, stream: true, stream_options: { include_usage: true } };
    const t = numberOrNull(ui.temperature, parseFloat);
    const p = numberOrNull(ui.topP, parseFloat);
    const n = numberOrNull(ui.maxTokens, (x) => parseInt(x, 10));
    if (t !== null) body.temperature = t;
    if (p !== null) body.top_p = p;
    if (n !== null) body.max_tokens = n;
    return body;
  }

  async function generate() {
    const reply = { role: "assistant", content: "", streaming: true };
    conversation.push(reply);
    render();
    setBusy(true);
    controller = new AbortController();
    const t0 = performance.now();
    let firstAt = null;
    let usage = null;
    let finish = null;
    try {
      const resp = await api("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(requestBody()), signal: controller.signal,
      });
      if (!resp.ok) throw new Error(await errorText(resp));
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
          const event = buf.slice(0, cut);
          buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
          const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
          if (!data || data === "[DONE]") continue;
          const msg = JSON.parse(data);
          if (msg.error) throw new Error(msg.error.message || "the server reported an error");
          if (msg.usage) usage = msg.usage;
          const choice = (msg.choices || [])[0];
          if (!choice) continue;
          if (choice.finish_reason) finish = choice.finish_reason;
          const piece = choice.delta && choice.delta.content;
          if (piece) {
            if (firstAt === null) firstAt = performance.now();
            reply.content += piece;
            updateStreaming(reply);
          }
        }
      }
      reply.meta = summary(usage, finish, t0, firstAt);
    } catch (e) {
      if (e.name === "AbortError") reply.meta = "Stopped. " + summary(usage, null, t0, firstAt);
      else { reply.meta = "Failed: " + e.message; setStatus("Error: " + e.message); }
    } finally {
      reply.streaming = false;
      controller = null;
      setBusy(false);
      save();
      render();
    }
  }

  function summary(usage, finish, t0, firstAt) {
    const parts = [];
    if (usage) parts.push(usage.completion_tokens + " tokens");
    if (firstAt !== null) parts.push("first token " + Math.round(firstAt - t0) + " ms");
    const secs = (performance.now() - t0) / 1000;
    parts.push(secs.toFixed(1) + " s");
    if (finish) parts.push("finish: " + finish);
    return parts.join(" · ");
  }

  function setBusy(busy) {
    ui.send.disabled = busy;
    ui.stop.disabled = !busy;
    setStatus(busy ? "Generating…" : "");
  }

  function send() {
    const text = ui.prompt.value;
    if (!text.trim() || controller) return;
    conversation.push({ role: "user", content: text });
    ui.prompt.value = "";
    save();
    generate();
  }

  // ------------------------------------------------------------------ events
  ui.form.addEventListener("submit", (e) => { e.preventDefault(); send(); });
  ui.prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  ui.stop.addEventListener("click", () => { if (controller) controller.abort(); });
  ui.newChat.addEventListener("click", () => {
    if (controller) controller.abort();
    conversation = [];
    save();
    render();
    ui.prompt.focus();
  });
  for (const input of [ui.model, ui.system, ui.temperature, ui.topP, ui.maxTokens]) input.addEventListener("change", save);
  if (window.matchMedia("(max-width: 720px)").matches) $("settings-box").open = false;

  // a reply cut off by closing the tab while it streamed is kept, marked as such
  conversation.forEach((m) => { if (m.streaming) { m.streaming = false; m.meta = "Interrupted."; } });
  render();
  loadModels();
})();
