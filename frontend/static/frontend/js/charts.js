// Charts from data the server wrote into the page. Mark a box with
//   <div class="chart" data-chart="CHART_ID" aria-label="…"></div>  and  {{ chart|json_script:"CHART_ID" }}
// where chart = {"kind": "line" | "bars" | "area", "x": [unix seconds…], "unit": "GPU-hours", "places": 2,
//                "quantity": "Remaining",  (the y-axis reads "Remaining (GPU-hours)")
//                "series": [{"label": "Used", "values": [...], "color": "#0b5cad", "dash": false}, …]}.
// Every chart draws amounts, so its y-axis starts at zero: a burn-down that starts at its lowest value makes a
// small change look like a collapse. Every chart also has a table or text with the same numbers nearby, for
// screen readers and for print. The uPlot instance is left on the box as `portalChart` (the browser tests read
// its scales).
"use strict";

(function () {
  const PALETTE = ["#0b5cad", "#b35900", "#116329", "#8a3ffc", "#b42318", "#3d4752"];

  // From zero (or below, for a negative amount) to a little above the largest value.
  function zeroBased(u, min, max) {
    const low = Math.min(0, min ?? 0);
    const high = Math.max(0, max ?? 0);
    if (high === low) return [low, low + 1];
    const [paddedLow, paddedHigh] = uPlot.rangeNum(low, high, 0.1, true);
    return [low < 0 ? paddedLow : 0, high > 0 ? paddedHigh : 0];
  }

  function axisLabel(chart) {
    const unit = chart.unit || "";
    if (!chart.quantity) return unit;
    return unit ? `${chart.quantity} (${unit})` : chart.quantity;
  }

  function build(box) {
    const chart = window.Portal.jsonFrom(box.dataset.chart);
    if (!chart || !chart.x || chart.x.length === 0) return;
    box.textContent = "";
    const bars = chart.kind === "bars";
    const series = [{}].concat(
      chart.series.map((one, index) => {
        const color = one.color || PALETTE[index % PALETTE.length];
        const options = { label: one.label, stroke: color, width: 2, value: (u, v) => (v == null ? "–" : `${v.toFixed(chart.places ?? 2)} ${chart.unit || ""}`) };
        if (one.dash) options.dash = [6, 4];
        if (bars) {
          options.fill = color;
          options.paths = uPlot.paths.bars({ size: [0.7, 40] });
          options.points = { show: false };
        } else if (chart.kind === "area" && !one.dash) {
          options.fill = color + "33";
        }
        return options;
      }),
    );
    const data = [chart.x].concat(chart.series.map((one) => one.values));
    const options = {
      width: box.clientWidth || 600,
      height: Number(box.dataset.height || 260),
      series,
      scales: { x: { time: chart.time !== false }, y: { range: zeroBased } },
      // The portal writes every time in UTC; the chart's axis does too, whatever the browser's zone.
      tzDate: (seconds) => uPlot.tzDate(new Date(seconds * 1e3), "Etc/UTC"),
      axes: [{}, { label: axisLabel(chart), size: 60 }],
      cursor: { drag: { x: false, y: false } },
    };
    const plot = new uPlot(options, data, box);
    box.portalChart = plot;
    new ResizeObserver(() => plot.setSize({ width: box.clientWidth, height: options.height })).observe(box);
  }

  function buildAll(root) {
    root.querySelectorAll("[data-chart]").forEach(build);
  }

  document.addEventListener("DOMContentLoaded", () => buildAll(document));
  document.addEventListener("htmx:afterSettle", (event) => buildAll(event.target));
})();
