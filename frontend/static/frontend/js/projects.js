// Projects area: the "Copy to clipboard" button beside a token shown once. Without a script (or a clipboard)
// the secret stays selectable as text, so the button only appears where copying can work.
"use strict";

(function () {
  function enable(button) {
    const source = document.getElementById(button.dataset.copy);
    const status = button.parentElement.querySelector("[data-copy-status]");
    if (!source || !navigator.clipboard) return;
    button.hidden = false;
    button.addEventListener("click", () => {
      navigator.clipboard.writeText(source.textContent.trim()).then(
        () => {
          if (status) status.textContent = "Copied.";
        },
        () => {
          if (status) status.textContent = "Copying was refused by the browser; select the token and copy it.";
        },
      );
    });
  }

  document.addEventListener("DOMContentLoaded", () => document.querySelectorAll("[data-copy]").forEach(enable));
})();
