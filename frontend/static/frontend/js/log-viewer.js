// The live log viewer of a job's page: stdout and stderr from /ws/jobs/<id>/log/, drawn as a terminal would.
//
// Why not xterm.js: its renderers inject <style> elements, which the content security policy
// (style-src 'self') refuses. This small renderer writes plain DOM text instead: "\r" moves back to the start
// of the line so the next characters overwrite it (progress bars), "\n" ends the line, "\b" steps back,
// tabs go to the next multiple of 8, ANSI SGR colours and bold become classes, "ESC[K" clears to the end of
// the line, and other escape sequences are dropped. Text stays selectable and readable by screen readers.
//
// The socket resumes from the byte offsets it has received (?stdout_offset=&stderr_offset=), so a reconnect
// neither loses nor repeats output.
"use strict";

(function () {
  const config = Portal.jsonFrom("job-log");
  const viewer = document.getElementById("log-viewer");
  if (!config || !viewer) return;

  const MAX_LINES = 20000; // older lines are dropped from the page (the download has them all)
  const COLOURS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];

  class Terminal {
    constructor(element) {
      this.element = element;
      this.lineCount = 0;
      this.dropped = false;
      this.reset();
    }

    reset() {
      this.element.replaceChildren();
      this.lineCount = 0;
      this.cells = []; // the current line: [{char, style}]
      this.column = 0;
      this.style = "";
      this.escape = null; // an escape sequence cut between two chunks
      this.current = this._newLine();
    }

    _newLine() {
      const line = document.createElement("div");
      line.className = "term-line";
      this.element.append(line);
      this.lineCount += 1;
      if (this.lineCount > MAX_LINES) {
        this.element.firstElementChild.remove();
        this.lineCount -= 1;
        if (!this.dropped) {
          this.dropped = true;
          this.element.dataset.dropped = "true";
        }
      }
      return line;
    }

    _draw() {
      const parts = [];
      let text = "";
      let style = null;
      for (const cell of this.cells) {
        const cellStyle = cell ? cell.style : "";
        if (style !== null && cellStyle !== style) {
          parts.push([style, text]);
          text = "";
        }
        style = cellStyle;
        text += cell ? cell.char : " ";
      }
      if (text) parts.push([style, text]);
      const nodes = parts.map(([partStyle, partText]) => {
        if (!partStyle) return document.createTextNode(partText);
        const span = document.createElement("span");
        span.className = partStyle;
        span.textContent = partText;
        return span;
      });
      this.current.replaceChildren(...nodes);
    }

    _sgr(parameters) {
      const codes = parameters === "" ? [0] : parameters.split(";").map((value) => Number(value) || 0);
      const classes = new Set(this.style ? this.style.split(" ") : []);
      const drop = (prefix) => {
        for (const name of [...classes]) if (name.startsWith(prefix)) classes.delete(name);
      };
      for (let index = 0; index < codes.length; index += 1) {
        const code = codes[index];
        if (code === 0) classes.clear();
        else if (code === 1) classes.add("term-bold");
        else if (code === 22) classes.delete("term-bold");
        else if (code === 3) classes.add("term-italic");
        else if (code === 4) classes.add("term-underline");
        else if (code >= 30 && code <= 37) (drop("term-fg-"), classes.add(`term-fg-${COLOURS[code - 30]}`));
        else if (code >= 90 && code <= 97) (drop("term-fg-"), classes.add(`term-fg-bright-${COLOURS[code - 90]}`));
        else if (code === 39) drop("term-fg-");
        else if (code >= 40 && code <= 47) (drop("term-bg-"), classes.add(`term-bg-${COLOURS[code - 40]}`));
        else if (code === 49) drop("term-bg-");
        else if (code === 38 || code === 48) index += codes[index + 1] === 5 ? 2 : 4; // 256/true colour: skipped
      }
      this.style = [...classes].sort().join(" ");
    }

    write(text) {
      let changed = false;
      for (const char of text) {
        if (this.escape !== null) {
          this.escape += char;
          if (this.escape === "\x1b[") continue;
          if (!this.escape.startsWith("\x1b[")) {
            this.escape = null; // a two-character escape (e.g. ESC 7): dropped
            continue;
          }
          if (char >= "@" && char <= "~") {
            const parameters = this.escape.slice(2, -1);
            if (char === "m") this._sgr(parameters);
            else if (char === "K" && (parameters === "" || parameters === "0")) this.cells.length = this.column;
            else if (char === "K" && parameters === "2") this.cells = [];
            this.escape = null;
            changed = true;
          }
          continue;
        }
        if (char === "\x1b") {
          this.escape = "\x1b";
        } else if (char === "\n") {
          this._draw();
          this.current = this._newLine();
          this.cells = [];
          this.column = 0;
          changed = false;
        } else if (char === "\r") {
          this.column = 0;
        } else if (char === "\b") {
          this.column = Math.max(0, this.column - 1);
        } else if (char === "\t") {
          const next = (Math.floor(this.column / 8) + 1) * 8;
          while (this.column < next) this._put(" ");
          changed = true;
        } else if (char >= " " && char !== "\x7f") {
          this._put(char);
          changed = true;
        }
      }
      if (changed || this.cells.length) this._draw();
    }

    _put(char) {
      while (this.cells.length < this.column) this.cells.push(null);
      this.cells[this.column] = { char, style: this.style };
      this.column += 1;
    }
  }

  const streams = ["stdout", "stderr"];
  const terminals = {};
  const offsets = { stdout: 0, stderr: 0 };
  const decoders = {};
  for (const stream of streams) {
    terminals[stream] = new Terminal(viewer.querySelector(`[data-terminal="${stream}"]`));
    decoders[stream] = new TextDecoder("utf-8");
  }
  const status = document.getElementById("log-status");
  const followButton = document.getElementById("log-follow");
  let shown = "stdout";
  let following = true;
  const notes = { stdout: "", stderr: "" };

  function setStatus(state, text) {
    status.dataset.state = state;
    status.textContent = text;
  }

  function scrollToEnd() {
    if (!following) return;
    const element = terminals[shown].element;
    element.scrollTop = element.scrollHeight;
  }

  // Stream buttons: one pressed at a time; the other terminal is hidden (its data is kept).
  for (const button of viewer.querySelectorAll("[data-stream]")) {
    button.addEventListener("click", () => {
      shown = button.dataset.stream;
      for (const other of viewer.querySelectorAll("[data-stream]")) {
        const pressed = other === button;
        other.setAttribute("aria-pressed", String(pressed));
        terminals[other.dataset.stream].element.hidden = !pressed;
        noteElements[other.dataset.stream].hidden = !pressed || !notes[other.dataset.stream];
      }
      scrollToEnd();
    });
  }

  // Follow: pressed, the view keeps to the newest output; released (paused), it stays where it is while new
  // output is still received and kept.
  followButton.addEventListener("click", () => {
    following = !following;
    followButton.setAttribute("aria-pressed", String(following));
    viewer.dataset.paused = String(!following);
    if (following) scrollToEnd();
    showLive();
  });

  let ended = null;
  function showLive() {
    if (ended) return;
    setStatus("live", following ? "Live: following the output" : "Live: paused (new output is kept; press Follow)");
  }

  function bytesOf(base64) {
    const binary = atob(base64);
    const bytes = new Uint8Array(binary.length);
    for (let index = 0; index < binary.length; index += 1) bytes[index] = binary.charCodeAt(index);
    return bytes;
  }

  // A line above each terminal saying what the stream is waiting for, or why it is empty.
  const noteElements = {};
  for (const stream of streams) {
    const element = document.createElement("p");
    element.className = "log-note";
    element.hidden = true;
    terminals[stream].element.before(element);
    noteElements[stream] = element;
  }

  function note(stream, text) {
    notes[stream] = text;
    noteElements[stream].textContent = text;
    noteElements[stream].hidden = !text || stream !== shown;
  }

  function take(message) {
    const stream = message.stream;
    if (message.type === "log.chunk") {
      if (message.offset !== offsets[stream]) return; // a repeat after a reconnect: already shown
      const text =
        "data_b64" in message
          ? decoders[stream].decode(bytesOf(message.data_b64), { stream: true })
          : message.data;
      offsets[stream] = message.next_offset;
      note(stream, "");
      terminals[stream].write(text);
      if (stream === shown) scrollToEnd();
    } else if (message.type === "log.waiting") {
      note(stream, `Waiting for the job to write its ${stream} (it is ${message.state}).`);
    } else if (message.type === "log.truncated") {
      offsets[stream] = 0;
      terminals[stream].reset();
      note(stream, `The ${stream} file was replaced or shortened; showing it again from the start.`);
    } else if (message.type === "log.error") {
      note(stream, message.message);
    } else if (message.type === "log.end") {
      ended = message.state;
      for (const name of streams) if (!offsets[name]) note(name, `The job wrote nothing to ${name}.`);
      setStatus("ended", `The job has ended (${message.state}); this is all of its output.`);
    }
  }

  // The socket, resuming from the offsets received so far ---------------------------------------------------
  let attempts = 0;
  let leaving = false;
  let socket = null;

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const query = `stdout_offset=${offsets.stdout}&stderr_offset=${offsets.stderr}`;
    // An array's page names its task in the socket's own query (?task=7): the offsets join it.
    const joiner = config.socket.includes("?") ? "&" : "?";
    socket = new WebSocket(`${scheme}//${window.location.host}${config.socket}${joiner}${query}`);
    socket.addEventListener("open", () => {
      attempts = 0;
      showLive();
    });
    socket.addEventListener("message", (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      take(message);
    });
    socket.addEventListener("close", (event) => {
      if (leaving || ended) return;
      if ([4400, 4401, 4403, 4404].includes(event.code)) {
        setStatus("closed", "The live log is not available; use the download links.");
        return;
      }
      attempts += 1;
      const pause = Math.min(15000, 1000 * 2 ** Math.min(attempts - 1, 4));
      setStatus("reconnecting", `Reconnecting in ${Math.round(pause / 1000)} s… (no output is lost)`);
      window.setTimeout(connect, pause);
    });
  }

  window.addEventListener("pagehide", () => {
    leaving = true;
    if (socket) socket.close();
  });
  connect();
})();
