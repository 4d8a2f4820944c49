// A small, safe Markdown renderer for model output. It never parses HTML: every piece of text becomes a
// Text node and every element is built with createElement, so "<script>" in a reply shows as text.
// Supports fenced code blocks (also while still open during streaming), headings, lists, quotes,
// paragraphs, and inline `code`, **bold**, *italic*, and [links](http(s) only).
"use strict";

(function () {
  const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)\s*$/;

  function renderMarkdown(text) {
    const root = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(FENCE);
      if (fence) {
        const body = [];
        i++;
        while (i < lines.length && !(lines[i].trim().startsWith(fence[1]) && lines[i].trim().replace(/[`~]/g, "") === "")) {
          body.push(lines[i]);
          i++;
        }
        i++; // the closing fence (absent while a reply is still streaming)
        root.append(codeBlock(body.join("\n"), fence[2]));
        continue;
      }
      if (!line.trim()) { i++; continue; }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        const h = document.createElement("h" + Math.min(6, heading[1].length + 2));
        inline(h, heading[2]);
        root.append(h);
        i++;
        continue;
      }
      if (/^\s*>/.test(line)) {
        const quote = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) { quote.push(lines[i].replace(/^\s*>\s?/, "")); i++; }
        const bq = document.createElement("blockquote");
        bq.append(renderMarkdown(quote.join("\n")));
        root.append(bq);
        continue;
      }
      const item = /^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/;
      if (item.test(line)) {
        const ordered = !!line.match(item)[1];
        const list = document.createElement(ordered ? "ol" : "ul");
        while (i < lines.length && item.test(lines[i]) && !!lines[i].match(item)[1] === ordered) {
          const li = document.createElement("li");
          inline(li, lines[i].match(item)[2]);
          list.append(li);
          i++;
        }
        root.append(list);
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !/^(#{1,6})\s/.test(lines[i])
             && !item.test(lines[i]) && !/^\s*>/.test(lines[i])) {
        para.push(lines[i]);
        i++;
      }
      const p = document.createElement("p");
      para.forEach((l, k) => { if (k) p.append(document.createElement("br")); inline(p, l); });
      root.append(p);
    }
    return root;
  }

  function codeBlock(code, lang) {
    const pre = document.createElement("pre");
    const c = document.createElement("code");
    if (lang) c.dataset.lang = lang;
    c.textContent = code;
    pre.append(c);
    return pre;
  }

  // Inline spans, left to right; anything unmatched is plain text. Each call has its own RegExp: the
  // recursion (bold inside a link, ...) must not move the caller's lastIndex.
  const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|\[([^\]]+)\]\(([^)\s]+)\)/.source;

  function inline(parent, text) {
    const re = new RegExp(INLINE, "g");
    let last = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
      if (m[1]) {
        const c = document.createElement("code");
        c.textContent = m[2].trim();
        parent.append(c);
      } else if (m[3] || m[4]) {
        const b = document.createElement("strong");
        inline(b, m[3] || m[4]);
        parent.append(b);
      } else if (m[5]) {
        const e = document.createElement("em");
        inline(e, m[5]);
        parent.append(e);
      } else if (m[6]) {
        parent.append(link(m[6], m[7]));
      }
      last = re.lastIndex;
    }
    if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
  }

  function link(label, href) {
    let url = null;
    try { url = new URL(href, window.location.href); } catch (e) { url = null; }
    if (!url || (url.protocol !== "http:" && url.protocol !== "https:")) {
      return document.createTextNode("[" + label + "](" + href + ")"); // javascript:, data:, ... stay text
    }
    const a = document.createElement("a");
    a.href = url.href;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    a.textContent = label;
    return a;
  }

  window.renderMarkdown = renderMarkdown;
})();
