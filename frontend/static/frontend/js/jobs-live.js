// Live job states without reloading. On the jobs list: one WebSocket per project shown
// (/ws/projects/<tenant>/<project>/jobs/) updates each row's badge, duration, cost and exit code in place (a
// running job's duration and cost count up every second in between) and, on the first page,
// inserts jobs submitted since the page was drawn. On a job's page: /ws/jobs/<id>/ redraws the facts, the
// timeline, the cancel button, the array's task table and the pipeline graph from the server (htmx) whenever the
// job, one of its tasks, or a parent or child of it changes.
"use strict";

(function () {
  const labels = Portal.jsonFrom("job-state-labels") || {};
  const FINAL = new Set(["completed", "failed", "cancelled", "timeout", "node_fail", "rejected"]);

  function utc(iso) {
    // As the server writes times: in the page's zone, "2026-11-21 15:05 UTC+01:00" (time-zone.js).
    return window.PortalTime.format(iso);
  }

  function timeElement(iso) {
    const element = document.createElement("time");
    element.dateTime = iso;
    element.textContent = utc(iso);
    return element;
  }

  function setBadge(badge, state) {
    badge.className = `badge badge-${state}`;
    badge.textContent = labels[state] || state;
  }

  // Running jobs' duration and cost -------------------------------------------------------------------------
  // Counted up every second from when the job started: its cost at the rate it runs at, rounded as the server
  // rounds it (billing/money.py: to the micro-unit, then half up to the currency's minor unit). A cell with
  // data-ended-at stays at its last value; billing prices the run from Slurm's accounting once it ends.

  const pad = (n) => String(n).padStart(2, "0");

  function durationText(seconds) {
    // As frontend/templatetags/job_figures.py writes it: 0:04:05, 26:00:00.
    const whole = Math.max(0, Math.floor(seconds));
    return `${Math.floor(whole / 3600)}:${pad(Math.floor((whole % 3600) / 60))}:${pad(whole % 60)}`;
  }

  function microUnits(price) {
    const [whole, fraction = ""] = String(price).split(".");
    return Number(whole) * 1e6 + Number(`${fraction}000000`.slice(0, 6));
  }

  function costText(cell, seconds) {
    const places = Number(cell.dataset.places || 2);
    const gpuSeconds = Number(cell.dataset.gpus) * Math.max(0, Math.floor(seconds));
    const micro = Math.round((gpuSeconds * microUnits(cell.dataset.price)) / 3600);
    const minor = Math.round(micro / 10 ** (6 - places));
    return `${(minor / 10 ** places).toFixed(places)} ${cell.dataset.currency}`;
  }

  function elapsed(cell, now) {
    const end = cell.dataset.endedAt ? Date.parse(cell.dataset.endedAt) : now;
    return (end - Date.parse(cell.dataset.startedAt)) / 1000;
  }

  function drawFigures(cells, now) {
    for (const cell of cells) {
      if (!cell.dataset.startedAt) continue;
      const seconds = elapsed(cell, now);
      if (Number.isNaN(seconds)) continue;
      if (cell.dataset.field === "duration") cell.textContent = durationText(seconds);
      else if (cell.dataset.price) cell.textContent = costText(cell, seconds);
    }
  }

  function tick() {
    drawFigures(
      document.querySelectorAll(
        "[data-field='duration'][data-started-at]:not([data-ended-at]), [data-field='cost'][data-price][data-started-at]:not([data-ended-at])",
      ),
      Date.now(),
    );
  }

  function updateFigures(row, job) {
    // A job that started or ended since the page was drawn: its cells start counting, or stop.
    const cells = row.querySelectorAll("[data-field='duration'], [data-field='cost']");
    for (const cell of cells) {
      if (job.started_at && (cell.dataset.field === "duration" || cell.dataset.price)) cell.dataset.startedAt = job.started_at;
      if (job.ended_at) cell.dataset.endedAt = job.ended_at;
    }
    drawFigures(cells, Date.now());
  }

  // The list ---------------------------------------------------------------------------------------------

  function startList(config) {
    const rows = document.getElementById("job-rows");
    const status = document.getElementById("jobs-live-status");
    const known = new Set(config.known);
    const notice = document.getElementById("new-jobs");
    let inserted = 0;
    if (!rows) return;
    for (const row of rows.querySelectorAll("tr[data-job-id]")) known.add(row.dataset.jobId);

    function matchesFilters(job) {
      const filters = config.filters;
      if (filters.project && job.project !== filters.project) return false;
      if (filters.owner && (job.user || "").toLowerCase() !== filters.owner.toLowerCase()) return false;
      if (filters.states.length && !filters.states.includes(job.state)) return false;
      if (filters.cluster && job.cluster !== filters.cluster) return false;
      if (filters.search) {
        const search = filters.search.toLowerCase();
        const byId = /^\d+$/.test(filters.search) && String(job.slurm_job_id) === filters.search;
        if (!byId && !job.name.toLowerCase().includes(search)) return false;
      }
      return true;
    }

    function cell(text) {
      const element = document.createElement("td");
      element.textContent = text;
      return element;
    }

    function newRow(job) {
      const row = document.createElement("tr");
      row.dataset.jobId = job.id;
      row.className = "job-new";
      const name = document.createElement("th");
      name.scope = "row";
      const link = document.createElement("a");
      link.href = `/jobs/${job.id}/`;
      link.textContent = job.name;
      name.append(link);
      const state = document.createElement("td");
      const badge = document.createElement("span");
      badge.dataset.field = "state";
      setBadge(badge, job.state);
      state.append(badge);
      const nodes = job.node_count > 1 ? ` on ${job.node_count} nodes` : "";
      const gpus = cell(`${job.total_gpus ?? job.gpus}${job.gpu_type ? ` × ${job.gpu_type}` : ""}${nodes}`);
      gpus.className = "number";
      gpus.dataset.field = "gpus";
      const owner = cell(job.user || job.cluster_username || "unknown");
      owner.dataset.field = "owner";
      const submitted = cell("");
      submitted.append(timeElement(job.updated_at));
      // Its cost is on the page once reloaded (the rate comes from the server); its duration counts from now.
      const figures = ["duration", "cost", "exit_code"].map((field) => {
        const figure = cell("—");
        // As frontend/jobs/_row.html marks them: phones fold the priority-2 columns.
        figure.className = field === "exit_code" ? "number priority-2" : "number";
        figure.dataset.field = field;
        return figure;
      });
      const project = cell(job.project);
      const cluster = cell(job.cluster);
      for (const folded of [project, owner, cluster, submitted]) folded.classList.add("priority-2");
      row.append(name, project, owner, cluster, state, gpus, submitted, ...figures);
      updateFigures(row, job);
      return row;
    }

    // As frontend/jobs/_array_progress.html words it.
    function progressText(progress) {
      const count = (key) => progress[key] || 0;
      const cancelled = count("cancelled") ? `, ${count("cancelled")} cancelled` : "";
      return `${count("completed")} done, ${count("failed")} failed, ${count("running")} running, ${count("pending")} pending${cancelled}`;
    }

    function update(job) {
      const row = rows.querySelector(`tr[data-job-id="${job.id}"]`);
      if (row) {
        const badge = row.querySelector("[data-field='state']");
        if (badge && badge.textContent !== (labels[job.state] || job.state)) setBadge(badge, job.state);
        const progress = row.querySelector("[data-field='array_progress']");
        if (progress && job.array_progress) progress.textContent = progressText(job.array_progress);
        updateFigures(row, job);
        const exitCode = row.querySelector("[data-field='exit_code']");
        if (exitCode && job.exit_code !== null && job.exit_code !== undefined) exitCode.textContent = String(job.exit_code);
        return;
      }
      // A job the page has not seen: new since the page was drawn (older active ones are in `known`).
      if (!config.insert_new || known.has(job.id) || FINAL.has(job.state) || !matchesFilters(job)) return;
      known.add(job.id);
      rows.prepend(newRow(job));
      inserted += 1;
      document.getElementById("jobs-table").hidden = false;
      const empty = document.getElementById("jobs-empty");
      if (empty) empty.hidden = true;
      if (notice) {
        notice.hidden = false;
        notice.textContent = inserted === 1 ? "1 new job appeared at the top." : `${inserted} new jobs appeared at the top.`;
      }
    }

    if (!config.projects.length) {
      status.dataset.state = "closed";
      status.textContent = "No projects to watch.";
      return;
    }
    for (const path of config.projects) {
      Portal.socket(path, {
        status,
        onMessage(message) {
          if (message.type === "job.update") update(message.job);
        },
      });
    }
  }

  // One job ------------------------------------------------------------------------------------------------

  function startJob(config) {
    let refreshing = false;
    let again = false;

    function refresh() {
      if (refreshing) {
        again = true;
        return;
      }
      refreshing = true;
      htmx
        // With the query: the page of tasks (and the task) shown stay as they are.
        .ajax("GET", window.location.pathname + window.location.search, {
          target: "#job-live",
          select: "#job-live",
          swap: "outerHTML",
        })
        .finally(() => {
          refreshing = false;
          if (again) {
            again = false;
            refresh();
          }
        });
    }

    Portal.socket(config.state_socket, {
      status: document.getElementById("job-live-status"),
      onMessage(message) {
        // A step of its pipeline changed (its graph), or tasks of the array did (its task table).
        if (message.type === "pipeline.update" || message.type === "job.tasks") {
          refresh();
          return;
        }
        if (message.type !== "job.update") return;
        const region = document.getElementById("job-live");
        if (!region) return;
        const job = message.job;
        if (region.dataset.state !== job.state || region.dataset.updatedAt !== job.updated_at) {
          region.dataset.state = job.state;
          region.dataset.updatedAt = job.updated_at;
          refresh();
        }
      },
    });
  }

  tick();
  window.setInterval(tick, 1000);
  const list = Portal.jsonFrom("jobs-live");
  if (list) startList(list);
  const job = Portal.jsonFrom("job-log");
  if (job) startJob(job);
})();
