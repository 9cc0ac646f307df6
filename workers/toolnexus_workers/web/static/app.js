// The open-requests page: live changes over server-sent events, answers sent with fetch.
// Served from the package itself (no CDN); the Content-Security-Policy allows only this file.
"use strict";

(() => {
  const list = document.getElementById("requests");
  const notes = document.getElementById("notes");
  const empty = document.getElementById("empty");
  const live = document.getElementById("live");
  const skewMs = Number(document.body.dataset.serverNow) * 1000 - Date.now();
  const NOTE_MS = 30000;

  function fragment(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    return template.content;
  }

  function cards(root) {
    return Array.from(root.querySelectorAll("article.request"));
  }

  function leftWords(leftS) {
    if (leftS <= 0) return "expired";
    if (leftS < 60) return `${leftS} s left`;
    if (leftS < 3600) return `${Math.floor(leftS / 60)} min ${leftS % 60} s left`;
    return `${Math.floor(leftS / 3600)} h ${Math.floor((leftS % 3600) / 60)} min left`;
  }

  function tick() {
    const nowS = (Date.now() + skewMs) / 1000;
    for (const element of document.querySelectorAll("[data-expires]")) {
      const leftS = Math.floor(Number(element.dataset.expires) - nowS);
      element.textContent = leftWords(leftS);
      element.classList.toggle("soon", leftS < 60);
    }
  }

  // A tool approval's inputs carry the proposed value (data-proposed): what differs is an
  // edit, listed as "Title: before → after" before the person sends it.
  function current(element) {
    if (element.matches("fieldset")) {
      return Array.from(element.querySelectorAll("input:checked"), (i) => i.value).join(",");
    }
    if (element.type === "checkbox") return element.checked ? "true" : "false";
    return element.value;
  }

  function said(element, key) {
    if (element.matches("fieldset")) {
      const picked = key.split(",").filter((k) => k !== "");
      const labels = picked.map((k) => {
        const label = element.querySelector(`input[value="${k}"] + label`);
        return label ? label.textContent : k;
      });
      return labels.length ? labels.join(", ") : "(none)";
    }
    if (element.type === "checkbox") return key === "true" ? "yes" : "no";
    if (element.matches("select")) {
      const option = Array.from(element.options).find((o) => o.value === key && key !== "");
      return option ? option.textContent : "(none)";
    }
    return key === "" ? "(empty)" : key;
  }

  function showEdits(card) {
    const box = card.querySelector(".edits");
    if (!box) return;
    const changes = box.querySelector("ul");
    changes.replaceChildren();
    for (const element of card.querySelectorAll("[data-proposed]")) {
      const now = current(element);
      if (now === element.dataset.proposed) continue;
      const item = document.createElement("li");
      const title = document.createElement("strong");
      title.textContent = element.dataset.title;
      const before = document.createElement("del");
      before.textContent = said(element, element.dataset.proposed);
      const after = document.createElement("ins");
      after.textContent = said(element, now);
      item.append(title, ": ", before, " → ", after);
      changes.append(item);
    }
    box.hidden = changes.children.length === 0;
  }

  function refresh() {
    empty.hidden = cards(list).length > 0;
    for (const card of cards(list)) showEdits(card);
    for (const element of list.querySelectorAll("time.asked:not([data-local])")) {
      element.textContent = `asked at ${new Date(element.dateTime).toLocaleTimeString()}`;
      element.dataset.local = "1";
    }
    tick();
  }

  function note(key, text) {
    if (!text) return;
    let item = notes.querySelector(`p[data-key="${key}"]`);
    if (!item) {
      item = document.createElement("p");
      item.className = "note";
      item.dataset.key = key;
      notes.prepend(item);
    }
    item.textContent = text;
    setTimeout(() => item.remove(), NOTE_MS);
  }

  function insert(card) {
    if (document.getElementById(card.id)) return; // shown already: keep what is typed in it
    const created = Number(card.dataset.created);
    const later = cards(list).find((other) => Number(other.dataset.created) < created);
    if (later) later.before(card);
    else list.append(card);
  }

  function typedIn(card) {
    const typed = "form.answer input:not([type=hidden]), form.answer textarea";
    for (const input of card.querySelectorAll(typed)) {
      if (input.type === "checkbox" ? input.checked !== input.defaultChecked
        : input.value !== input.defaultValue) return true;
    }
    for (const option of card.querySelectorAll("form.answer option")) {
      if (option.selected !== option.defaultSelected) return true;
    }
    return false;
  }

  function keep(card, text) {
    // A request that left while an answer was being typed in it: kept, greyed, until dismissed.
    card.classList.add("is-gone");
    for (const element of card.querySelectorAll("input, select, textarea, button")) {
      element.disabled = true;
    }
    const line = document.createElement("p");
    line.className = "gone-note";
    line.setAttribute("role", "status");
    line.textContent = `${text} What you typed is kept here, but it can no longer be sent.`;
    card.querySelector("header.meta").after(line);
    const actions = card.querySelector(".actions");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "remove";
    remove.textContent = "Remove";
    actions.replaceChildren(remove);
  }

  function gone(key, text) {
    const card = document.getElementById(key);
    if (!card || card.classList.contains("is-gone")) return;
    if (typedIn(card)) keep(card, text);
    else {
      card.remove();
      note(key, text);
    }
    refresh();
  }

  function escalated(key, text) {
    const card = document.getElementById(key);
    const element = card && card.querySelector("p.escalated");
    if (!element) return;
    element.textContent = text;
    element.hidden = false;
    card.classList.add("is-escalated");
  }

  function reset(html) {
    const fresh = cards(fragment(html));
    const keys = new Set(fresh.map((card) => card.id));
    for (const card of cards(list)) {
      if (!keys.has(card.id) && !card.classList.contains("is-gone")) card.remove();
    }
    for (const card of fresh) insert(card);
    refresh();
  }

  function problem(card, text) {
    const form = card.querySelector("form.answer");
    let element = form.querySelector("p.form-error");
    if (!element) {
      element = document.createElement("p");
      element.className = "form-error";
      element.setAttribute("role", "alert");
      form.prepend(element);
    }
    element.textContent = text;
    for (const button of form.querySelectorAll("button")) button.disabled = false;
  }

  list.addEventListener("click", (event) => {
    const remove = event.target.closest("button.remove");
    if (!remove) return;
    remove.closest("article.request").remove();
    refresh();
  });

  list.addEventListener("input", (event) => {
    const card = event.target.closest("article.request");
    if (card) showEdits(card);
  });

  list.addEventListener("submit", async (event) => {
    const form = event.target.closest("form.answer");
    if (!form) return;
    event.preventDefault();
    const card = form.closest("article.request");
    const body = new URLSearchParams(new FormData(form, event.submitter));
    for (const button of form.querySelectorAll("button")) button.disabled = true;
    let reply;
    try {
      const response = await fetch("/answer", {
        method: "POST",
        body,
        headers: { "X-Toolnexus-Fetch": "1" },
        credentials: "same-origin",
      });
      if (!(response.headers.get("content-type") || "").includes("json")) {
        problem(card, `Not sent: ${await response.text()}`);
        return;
      }
      reply = await response.json();
    } catch (error) {
      problem(card, `Not sent: the page cannot reach its server (${error.message}).`);
      return;
    }
    if (reply.card) {
      const fresh = cards(fragment(reply.card))[0];
      card.replaceWith(fresh);
      refresh();
      const wrong = fresh.querySelector('[aria-invalid="true"]');
      const target = wrong && wrong.matches("fieldset") ? wrong.querySelector("input") : wrong;
      if (target) target.focus();
      return;
    }
    card.remove();
    note(card.id, reply.note);
    refresh();
  });

  function connect() {
    const source = new EventSource("/events");
    source.addEventListener("open", () => {
      live.textContent = "Live: new requests appear here by themselves.";
      live.dataset.state = "live";
    });
    source.addEventListener("error", () => {
      const closed = source.readyState === EventSource.CLOSED;
      live.textContent = closed ? "Disconnected: reload the page." : "Reconnecting…";
      live.dataset.state = "down";
    });
    source.addEventListener("reset", (event) => reset(event.data));
    source.addEventListener("shown", (event) => {
      const change = JSON.parse(event.data);
      insert(cards(fragment(change.html))[0]);
      refresh();
    });
    source.addEventListener("gone", (event) => {
      const change = JSON.parse(event.data);
      gone(change.key, change.note);
    });
    source.addEventListener("progress", (event) => {
      const change = JSON.parse(event.data); // a quorum's count: the card stays
      const shown = document.querySelector(`[id="${change.key}"] .approvals`);
      if (shown) shown.textContent = change.approvals;
    });
    source.addEventListener("escalated", (event) => {
      const change = JSON.parse(event.data);
      escalated(change.key, change.note);
    });
  }

  refresh();
  setInterval(tick, 1000);
  connect();
})();
