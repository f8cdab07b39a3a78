// Shared behaviour of every page. No inline scripts anywhere (the content security policy forbids them):
// pages mark elements with data-* attributes and load a script of their own from this folder.
"use strict";

window.Portal = (function () {
  // A WebSocket to the portal that reconnects by itself, with growing pauses (1 s up to 15 s).
  // `status` (optional) is an element whose text and data-state say whether updates are live.
  function socket(path, { onMessage, onOpen, status } = {}) {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${window.location.host}${path}`;
    let attempts = 0;
    let closedByPage = false;
    let current = null;

    function show(state, text) {
      if (!status) return;
      status.dataset.state = state;
      status.textContent = text;
    }

    function connect() {
      current = new WebSocket(url);
      current.addEventListener("open", () => {
        attempts = 0;
        show("live", "Live");
        if (onOpen) onOpen(current);
      });
      current.addEventListener("message", (event) => {
        let data;
        try {
          data = JSON.parse(event.data);
        } catch (error) {
          return;
        }
        if (onMessage) onMessage(data, current);
      });
      current.addEventListener("close", (event) => {
        if (closedByPage) return;
        if (event.code === 4403 || event.code === 4404 || event.code === 4401) {
          show("closed", "Live updates are not available for this page.");
          return;
        }
        attempts += 1;
        const pause = Math.min(15000, 1000 * 2 ** Math.min(attempts - 1, 4));
        show("reconnecting", `Reconnecting in ${Math.round(pause / 1000)} s…`);
        window.setTimeout(connect, pause);
      });
    }

    connect();
    window.addEventListener("pagehide", () => {
      closedByPage = true;
      if (current) current.close();
    });
    return {
      send(data) {
        if (current && current.readyState === WebSocket.OPEN) current.send(JSON.stringify(data));
      },
      close() {
        closedByPage = true;
        if (current) current.close();
      },
    };
  }

  // Reads a JSON block written by Django's json_script filter.
  function jsonFrom(id) {
    const element = document.getElementById(id);
    return element ? JSON.parse(element.textContent) : null;
  }

  function formatDuration(seconds) {
    if (seconds == null || Number.isNaN(seconds)) return "";
    seconds = Math.max(0, Math.round(seconds));
    const hours = Math.floor(seconds / 3600);
    const minutes = Math.floor((seconds % 3600) / 60);
    const rest = seconds % 60;
    if (hours) return `${hours} h ${String(minutes).padStart(2, "0")} min`;
    if (minutes) return `${minutes} min ${String(rest).padStart(2, "0")} s`;
    return `${rest} s`;
  }

  // Moves keyboard focus to the first field with an error after a form comes back from the server.
  document.addEventListener("htmx:afterSwap", (event) => {
    const invalid = event.target.querySelector && event.target.querySelector("[aria-invalid='true']");
    if (invalid && event.detail.requestConfig && event.detail.requestConfig.verb === "post") invalid.focus();
  });

  // The phone menu: the header's button shows and hides the navigation and account links (CSS folds them
  // only once the header has `menu-ready`, so without this script they stay visible). Escape closes it and
  // gives focus back to the button.
  function setUpMenu() {
    const toggle = document.querySelector("[data-menu-toggle]");
    if (!toggle) return;
    const header = toggle.closest(".site-header");
    function setOpen(open) {
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
    }
    toggle.hidden = false;
    header.classList.add("menu-ready");
    toggle.addEventListener("click", () => setOpen(toggle.getAttribute("aria-expanded") !== "true"));
    header.addEventListener("keydown", (event) => {
      if (event.key !== "Escape" || toggle.getAttribute("aria-expanded") !== "true") return;
      setOpen(false);
      toggle.focus();
    });
  }

  // A table wider than its box scrolls sideways inside its `.table-scroll` wrapper; keyboard users scroll it
  // once it takes focus, so a wrapper that scrolls becomes a focusable, named region.
  function makeScrollingTablesFocusable(root) {
    root.querySelectorAll(".table-scroll").forEach((wrapper) => {
      if (wrapper.hasAttribute("tabindex") || wrapper.scrollWidth <= wrapper.clientWidth) return;
      wrapper.tabIndex = 0;
      wrapper.setAttribute("role", "region");
      const table = wrapper.querySelector("table");
      const caption = table && table.caption;
      const heading = wrapper.closest("section, .card")?.querySelector("h2, h3");
      const name = (caption || heading)?.textContent.trim();
      wrapper.setAttribute("aria-label", name ? `${name} (scrolls sideways)` : "Table (scrolls sideways)");
    });
  }

  function setUpPage() {
    setUpMenu();
    makeScrollingTablesFocusable(document);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUpPage);
  else setUpPage();
  document.addEventListener("htmx:afterSettle", (event) => makeScrollingTablesFocusable(event.target));
  window.addEventListener("resize", () => makeScrollingTablesFocusable(document));

  return { socket, jsonFrom, formatDuration };
})();
