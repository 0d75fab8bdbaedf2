// Herald's console: the live parts of server-rendered pages. No framework,
// no build step; every page works without it, it only saves reloading.
"use strict";

(function () {
  const $ = (sel, root) => (root || document).querySelector(sel);

  // A note in the page's live region (read out by screen readers).
  function notify(html, kind) {
    const box = $("#notices");
    if (!box) return;
    const note = document.createElement("div");
    note.className = "notice " + (kind || "");
    note.innerHTML = html;
    const close = document.createElement("button");
    close.type = "button";
    close.textContent = "Dismiss";
    close.addEventListener("click", () => note.remove());
    note.appendChild(close);
    box.appendChild(note);
  }

  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  // Runs a function at most once per `ms`, and once more after a burst.
  function throttle(fn, ms) {
    let last = 0, timer = null;
    return function () {
      const wait = last + ms - Date.now();
      if (wait <= 0) { last = Date.now(); fn(); return; }
      if (!timer) timer = setTimeout(() => { timer = null; last = Date.now(); fn(); }, wait);
    };
  }

  // The run page: progress from /runs/{id}/live whenever the run moves.
  const runBox = $("#run[data-run]");
  let refreshRun = null;
  if (runBox) {
    const id = runBox.dataset.run;
    let ended = runBox.dataset.final === "true";
    const set = (sel, text) => { const el = $(sel); if (el) el.textContent = text; };
    // Parts of the page read again from the server as it draws them.
    const refreshFrom = async (sels) => {
      const res = await fetch(window.location.href, { credentials: "same-origin" });
      if (!res.ok) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      for (const sel of sels) {
        const fresh = doc.querySelector(sel), here = $(sel);
        if (fresh && here) here.innerHTML = fresh.innerHTML;
      }
    };
    // At the end: the groups' final status and the actions left (retry).
    const refreshTable = () => refreshFrom(["#targets", "#run-actions", "#polls"]);
    refreshRun = throttle(async () => {
      const res = await fetch("/runs/" + id + "/live", { credentials: "same-origin" });
      if (!res.ok) return;
      const l = await res.json();
      set("#run-delivered", l.delivered);
      const bar = $("#run-bar");
      if (bar) { bar.max = Math.max(l.total, 1); bar.value = l.sent; }
      const st = $("#run-status");
      if (st) st.innerHTML = '<span class="badge ' + esc(l.status) + '">' + esc(l.status.replace("_", " ")) + "</span>";
      set("#run-failed", l.failed + " / " + l.skipped);
      set("#run-pace", l.pace || "—");
      set("#run-finish", l.expected_finish || "—");
      set("#run-close", l.window_close || "—");
      set("#run-summary", l.summary || "");
      set("#run-receipts", l.receipts);
      set("#run-amendment", l.amendment);
      if (l.is_final && !ended) {
        ended = true;
        runBox.dataset.final = "true";
        refreshTable();
        notify("Run " + esc(l.id) + " ended: <strong>" + esc(l.status) + "</strong>, " + esc(l.delivered) +
          ".", "end");
      }
    }, 400);
    refreshRun();
    // Receipts and poll votes keep coming after the last send, without
    // events: the totals, the groups' columns and the answers are read
    // again every few seconds.
    setInterval(() => {
      refreshRun();
      if (ended) refreshTable();
      else if ($("#polls")) refreshFrom(["#polls"]);
    }, 5000);
  }

  // The overview's "Sending now" list, refreshed from the page itself.
  const sending = $("#now-sending");
  const refreshOverview = sending && throttle(async () => {
    const res = await fetch("/", { credentials: "same-origin" });
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    const fresh = doc.querySelector("#now-sending");
    if (fresh) sending.innerHTML = fresh.innerHTML;
  }, 2000);

  // Browser notifications, for what needs the operator even when the
  // console is a background tab: a run that did not deliver everything, an
  // account that cannot send. Asked for once, from a button (browsers only
  // prompt on a click); the answer is the browser's to keep.
  const canNotify = () => "Notification" in window && Notification.permission === "granted";
  function alarm(title, body, href) {
    if (!canNotify()) return;
    const n = new Notification(title, { body: body, tag: href });
    n.onclick = () => { window.focus(); window.location = href; };
  }
  if ("Notification" in window && Notification.permission === "default" &&
      !document.body.classList.contains("signin") && !localStorage.getItem("herald.notify-asked")) {
    const box = $("#notices");
    if (box) {
      const ask = document.createElement("div");
      ask.className = "notice";
      ask.id = "notify-ask";
      ask.textContent = "Be told when a run ends short or an account stops, even in another tab. ";
      const yes = document.createElement("button");
      yes.type = "button";
      yes.textContent = "Turn on notifications";
      yes.addEventListener("click", () => {
        localStorage.setItem("herald.notify-asked", "1");
        Notification.requestPermission().finally(() => ask.remove());
      });
      const no = document.createElement("button");
      no.type = "button";
      no.textContent = "Not now";
      no.addEventListener("click", () => { localStorage.setItem("herald.notify-asked", "1"); ask.remove(); });
      ask.append(yes, " ", no);
      box.appendChild(ask);
    }
  }
  const ALARMING_RUNS = ["partial", "failed"];
  const ALARMING_ACCOUNTS = ["logged_out", "banned"];

  // One stream per page; the session cookie authenticates it.
  if (window.EventSource && !document.body.classList.contains("signin")) {
    const onRun = (e) => {
      let ev;
      try { ev = JSON.parse(e.data); } catch (_) { return; }
      if (runBox && String(ev.run_id) === runBox.dataset.run) refreshRun();
      if (refreshOverview) refreshOverview();
      const d = ev.data || {};
      const href = "/runs/" + ev.run_id;
      if (e.type !== "run_finished" && e.type !== "run_missed") return;
      // Named as people know it ("Monday standup · run 12"), from the run's
      // live view; by its id if that cannot be read.
      fetch(href + "/live", { credentials: "same-origin" })
        .then((r) => (r.ok ? r.json() : null))
        .catch(() => null)
        .then((live) => {
          const name = (live && live.label) || ("Run " + ev.run_id);
          if (e.type === "run_finished" && ALARMING_RUNS.includes(d.status)) {
            alarm(name + " ended " + d.status, d.delivered || "", href);
          } else if (e.type === "run_missed") {
            alarm(name + " missed", d.error_summary || "picked up after the late-fire grace", href);
          }
          if (e.type === "run_finished" && !(runBox && String(ev.run_id) === runBox.dataset.run)) {
            notify('<a href="' + esc(href) + '">' + esc(name) + "</a> ended: <strong>" +
              esc(d.status || "") + "</strong>, " + esc(d.delivered || ""), "end");
          }
        });
    };
    let es = null;
    const follow = () => {
      es = new EventSource("/v1/events");
      ["run_queued", "run_scheduled", "run_started", "run_progress", "run_finished", "run_parked", "run_missed", "window_closed"]
        .forEach((k) => es.addEventListener(k, onRun));
      es.addEventListener("account_state", (e) => {
        let ev;
        try { ev = JSON.parse(e.data); } catch (_) { return; }
        const d = ev.data || {};
        if (ALARMING_ACCOUNTS.includes(d.state)) {
          alarm("Account " + ev.account_id + " " + String(d.state).replace("_", " "), d.reason || "",
            "/accounts/" + encodeURIComponent(ev.account_id));
        }
      });
      // Whatever happened between the page and the stream's opening.
      es.addEventListener("open", () => { if (refreshRun) refreshRun(); });
    };
    follow();
    // A page left for another must let its stream go at once: a browser
    // keeps at most six connections to a host, and streams of pages kept
    // for "back" would soon hold them all and stall every request.
    window.addEventListener("pagehide", () => { if (es) { es.close(); es = null; } });
    window.addEventListener("pageshow", (e) => { if (e.persisted && !es) follow(); });
  }

  // The reminder form: the account's groups come with the page.
  const form = $("#reminder-form");
  if (form) {
    const account = $("#account_id", form);
    if (account && form.getAttribute("action") === "/reminders") {
      account.addEventListener("change", () => {
        window.location = "/reminders/new?account=" + encodeURIComponent(account.value);
      });
    }
    const search = $("#group-search", form);
    if (search) {
      search.addEventListener("input", () => {
        const q = search.value.trim().toLowerCase();
        document.querySelectorAll("#group-list li").forEach((li) => {
          li.hidden = q !== "" && !li.dataset.name.includes(q);
        });
      });
      // Enter in the search box filters; it does not submit the form.
      search.addEventListener("keydown", (e) => { if (e.key === "Enter") e.preventDefault(); });
    }
    const picture = $("#picture", form);
    if (picture) {
      picture.addEventListener("change", async () => {
        const file = picture.files[0];
        const state = $("#picture-state");
        const preview = $("#picture-preview");
        if (!file) return;
        preview.src = URL.createObjectURL(file);
        preview.hidden = false;
        state.textContent = "Uploading " + file.name + "…";
        const res = await fetch("/media?filename=" + encodeURIComponent(file.name), {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": file.type || "application/octet-stream", "X-CSRF-Token": $("input[name=csrf]", form).value },
          body: file,
        });
        const body = await res.json().catch(() => ({}));
        if (res.ok) {
          $("#media", form).value = body.id;
          state.textContent = "Picture " + body.id + " attached (" + body.size + " bytes).";
          state.dataset.ready = "true";
        } else {
          state.textContent = "Not attached: " + (body.detail || res.status);
        }
      });
    }
  }

  // Pairing: follow the state, redraw the QR as WhatsApp replaces it.
  const pairing = $("#pairing[data-account]");
  if (pairing) {
    const id = encodeURIComponent(pairing.dataset.account);
    let lastQr = null;
    const poll = async () => {
      const res = await fetch("/accounts/" + id + "/pair/state", { credentials: "same-origin" });
      const s = await res.json().catch(() => ({}));
      $("#pair-state").textContent = res.ok ? "Pairing: " + String(s.state).replace(/_/g, " ") : (s.detail || "Pairing unavailable");
      const code = $("#pair-code");
      code.hidden = !s.pair_code;
      code.textContent = s.pair_code ? "Pair code: " + s.pair_code : "";
      const img = $("#pair-qr");
      if (s.qr && s.qr !== lastQr) {
        lastQr = s.qr;
        img.src = "/accounts/" + id + "/pair/qr.png?v=" + Date.now();
        img.hidden = false;
      } else if (!s.qr) {
        img.hidden = true;
      }
      if (s.state !== "paired") setTimeout(poll, 2000);
    };
    poll();
  }
})();
