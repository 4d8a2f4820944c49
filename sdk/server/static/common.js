// octavo web UI, shared by both pages: the API key (asked once, on the first 401, kept in localStorage)
// and `api()`, a fetch that sends it. No framework, no build step.
"use strict";

const KEY_STORE = "octavo.apiKey";

function getKey() {
  try { return localStorage.getItem(KEY_STORE) || ""; } catch (e) { return ""; }
}

function setKey(key) {
  try { localStorage.setItem(KEY_STORE, key); } catch (e) { /* private mode: kept for this page only */ }
  window.__octavoKey = key;
}

function currentKey() { return window.__octavoKey || getKey(); }

// Show the key dialog (built once per page); resolves with the key typed, or null if cancelled.
let keyPromise = null;
function askKey(message) {
  if (keyPromise) return keyPromise;
  keyPromise = new Promise((resolve) => {
    let dlg = document.getElementById("key-dialog");
    if (!dlg) {
      dlg = document.createElement("dialog");
      dlg.id = "key-dialog";
      dlg.setAttribute("aria-labelledby", "key-title");
      const form = document.createElement("form");
      form.method = "dialog";
      const title = document.createElement("h2");
      title.id = "key-title";
      title.textContent = "API key needed";
      const note = document.createElement("p");
      note.id = "key-note";
      const label = document.createElement("label");
      label.htmlFor = "key-input";
      label.textContent = "API key (kept in this browser)";
      const input = document.createElement("input");
      input.id = "key-input";
      input.type = "password";
      input.autocomplete = "off";
      const row = document.createElement("div");
      row.className = "row";
      const ok = document.createElement("button");
      ok.className = "primary";
      ok.value = "ok";
      ok.textContent = "Use key";
      const cancel = document.createElement("button");
      cancel.value = "cancel";
      cancel.textContent = "Cancel";
      row.append(ok, cancel);
      form.append(title, note, label, input, row);
      dlg.append(form);
      document.body.append(dlg);
    }
    document.getElementById("key-note").textContent = message;
    const input = document.getElementById("key-input");
    input.value = "";
    dlg.addEventListener("close", function onClose() {
      dlg.removeEventListener("close", onClose);
      keyPromise = null;
      if (dlg.returnValue === "ok" && input.value) { setKey(input.value.trim()); resolve(input.value.trim()); }
      else resolve(null);
    });
    dlg.showModal();
    input.focus();
  });
  return keyPromise;
}

// fetch(path) with the key; on 401 ask for the key (once) and retry. Throws on network errors only.
async function api(path, options = {}) {
  for (let attempt = 0; attempt < 3; attempt++) {
    const headers = Object.assign({}, options.headers || {});
    const key = currentKey();
    if (key) headers["Authorization"] = "Bearer " + key;
    const resp = await fetch(path, Object.assign({}, options, { headers }));
    if (resp.status !== 401) return resp;
    const msg = key ? "The server refused this key. Enter the right one." : "This server needs an API key.";
    if (!(await askKey(msg))) return resp;
  }
  return fetch(path, options);
}

// The error message of an OpenAI-shaped error response, or the status line.
async function errorText(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (e) { /* not JSON */ }
  return "HTTP " + resp.status + " " + resp.statusText;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

window.octavo = { api, errorText, el, askKey, currentKey };
