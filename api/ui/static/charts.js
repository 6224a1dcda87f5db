// Line charts over uPlot (vendor/uPlot.iife.min.js), for every page that draws curves.
//
//   const chart = Charts.line(element, { title: "loss", xLabel: "step", time: false });
//   chart.update({ x: [...], series: [{ label, y: [...], group, dash, points }], markers: [{ x, label }] });
//   (points: true draws the points as dots where they are sparse, uPlot's rule: a one-point series shows)
//   chart.setOptions({ log: true, smoothing: 0.6 });
//   element.chart.xRange() / .points() / .zoomTo(min, max)   (what the browser tests use)
//
// An update keeps the user's zoom: once zoomed (drag to select a range), new data is drawn inside that range
// until a double click zooms back out; unzoomed, the range grows with the data.
"use strict";

const Charts = (() => {
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

  // Exponential moving average (TensorBoard's smoothing); a gap (null) restarts it.
  function smooth(values, weight) {
    if (!weight) return values;
    let last = null;
    return values.map((v) => {
      if (v == null) {
        last = null;
        return null;
      }
      last = last == null ? v : last * weight + (1 - weight) * v;
      return last;
    });
  }

  function markersPlugin(getMarkers) {
    return {
      hooks: {
        draw: (u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#f59e0b";
          ctx.fillStyle = "#b45309";
          ctx.setLineDash([4, 4]);
          ctx.lineWidth = 1.5 * devicePixelRatio;
          ctx.font = `${11 * devicePixelRatio}px sans-serif`;
          for (const marker of getMarkers()) {
            const x = u.valToPos(marker.x, "x", true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            ctx.fillText(marker.label, x + 3 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
          }
          ctx.restore();
        },
      },
    };
  }

  function line(element, config) {
    let plot = null;
    let data = { x: [], series: [], markers: [] };
    let options = { log: false, smoothing: 0 };
    let zoom = null; // [min, max] while the user has zoomed in
    let shape = ""; // the series' labels: a new series (an attempt) rebuilds the plot

    function size() {
      return { width: Math.max(element.clientWidth || 600, 300), height: config.height || 260 };
    }

    function columns() {
      const ys = data.series.map((s) => {
        let y = smooth(s.y, options.smoothing);
        if (options.log) y = y.map((v) => (v != null && v > 0 ? v : null));
        return y;
      });
      return [data.x, ...ys];
    }

    function build() {
      if (plot) plot.destroy();
      const colorOf = {};
      const series = [{ label: config.xLabel || "x" }];
      data.series.forEach((s) => {
        const key = s.group || s.label;
        if (!(key in colorOf)) colorOf[key] = PALETTE[Object.keys(colorOf).length % PALETTE.length];
        series.push({ label: s.label, stroke: colorOf[key], width: 1.5, dash: s.dash, spanGaps: false, points: s.points ? { size: 5 } : { show: false } });
      });
      const opts = {
        title: config.title,
        ...size(),
        series,
        scales: { x: { time: !!config.time }, y: { distr: options.log ? 3 : 1 } },
        axes: [{ label: config.xLabel }, { size: 64, values: (u, splits) => splits.map(App.formatNumber) }],
        cursor: { drag: { x: true, y: false } },
        legend: { live: true },
        plugins: [markersPlugin(() => data.markers || [])],
        hooks: {
          setSelect: [
            (u) => {
              if (u.select.width > 0) {
                zoom = [u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x")];
              }
            },
          ],
        },
      };
      plot = new uPlot(opts, columns(), element);
      plot.over.addEventListener("dblclick", () => {
        zoom = null; // uPlot zooms out itself on a double click
      });
      if (zoom) plot.setScale("x", { min: zoom[0], max: zoom[1] });
    }

    function update(next) {
      data = { x: next.x || [], series: next.series || [], markers: next.markers || [] };
      // What the chart holds, for tests and anyone inspecting the page: x values and series drawn.
      element.dataset.points = String(data.x.length);
      element.dataset.series = String(data.series.length);
      const nextShape = data.series.map((s) => s.label).join("\u0000");
      if (!plot || nextShape !== shape) {
        shape = nextShape;
        build();
        return;
      }
      plot.setData(columns(), !zoom); // zoomed: keep the scales as they are
      if (zoom) plot.setScale("x", { min: zoom[0], max: zoom[1] });
    }

    function setOptions(changes) {
      const rebuild = "log" in changes && changes.log !== options.log;
      options = { ...options, ...changes };
      if (!plot) return;
      if (rebuild) build();
      else {
        plot.setData(columns(), !zoom);
        if (zoom) plot.setScale("x", { min: zoom[0], max: zoom[1] });
      }
    }

    window.addEventListener("resize", () => plot && plot.setSize(size()));
    const api = {
      update,
      setOptions,
      resetZoom: () => ((zoom = null), plot && build()),
      // What the x-axis shows now, and how many x values the chart holds (the browser tests read these).
      xRange: () => (plot ? [plot.scales.x.min, plot.scales.x.max] : null),
      points: () => data.x.length,
      zoomTo: (min, max) => {
        zoom = [min, max];
        if (plot) plot.setScale("x", { min, max });
      },
    };
    element.chart = api; // reachable from the page: document.querySelector(".chart").chart
    return api;
  }

  return { line, smooth };
})();
