// The spend overview's chart: one pair of bars per group (this period, the previous one), drawn from the JSON the
// server wrote beside the box:
//   <div data-spend-chart="DATA_ID" aria-label="…"></div>  {{ chart|json_script:"DATA_ID" }}
// where chart = {"labels": [group…], "unit": "EUR", "places": 2, "series": [{"label", "values"}, {…}]}.
// Amounts start at zero, whatever the smallest bar, and the axis names the currency; the table below the chart
// holds the same figures. The uPlot instance is kept on the box (`spendPlot`) for the browser tests.
"use strict";

(function () {
  const COLORS = ["#0b5cad", "#b35900"];

  function build(box) {
    const chart = window.Portal.jsonFrom(box.dataset.spendChart);
    if (!chart || !chart.labels || chart.labels.length === 0) return;
    box.textContent = "";
    const places = chart.places ?? 2;
    const positions = chart.labels.map((_, index) => index);
    const series = [{ label: "Group", value: (u, index) => (index == null ? "–" : chart.labels[index]) }].concat(
      chart.series.map((one, index) => ({
        label: one.label,
        stroke: COLORS[index % COLORS.length],
        fill: COLORS[index % COLORS.length],
        width: 1,
        points: { show: false },
        paths: uPlot.paths.bars({ size: [0.4, 48], align: index === 0 ? -1 : 1 }),
        value: (u, value) => (value == null ? "–" : `${value.toFixed(places)} ${chart.unit}`),
      })),
    );
    const options = {
      width: box.clientWidth || 600,
      height: Number(box.dataset.height || 300),
      series,
      scales: {
        x: { time: false, range: () => [-0.6, chart.labels.length - 0.4] },
        // Zero-based: a bar's height is its amount, not its distance from the smallest one.
        y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] },
      },
      axes: [
        { splits: () => positions, values: (u, splits) => splits.map((index) => chart.labels[index] ?? "") },
        { label: chart.unit, size: 70, values: (u, splits) => splits.map((value) => value.toFixed(places)) },
      ],
      cursor: { drag: { x: false, y: false } },
    };
    const data = [positions].concat(chart.series.map((one) => one.values));
    const plot = new uPlot(options, data, box);
    box.spendPlot = plot;
    new ResizeObserver(() => plot.setSize({ width: box.clientWidth, height: options.height })).observe(box);
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-spend-chart]").forEach(build);
  });
})();
