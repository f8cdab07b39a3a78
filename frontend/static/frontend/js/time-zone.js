// Times in the reader's zone. Tells the server the browser's time zone (the portal_time_zone cookie, which
// frontend/time_zones.py reads when the person has not chosen a zone in their profile), and writes live times the
// way the server does: 24-hour with the offset from UTC, "2026-11-26 20:20 UTC+01:00", in the zone the page was
// drawn in (<body data-time-zone>).
"use strict";

window.PortalTime = (function () {
  const COOKIE = "portal_time_zone";

  function browserZone() {
    try {
      return Intl.DateTimeFormat().resolvedOptions().timeZone || "";
    } catch (error) {
      return "";
    }
  }

  function pageZone() {
    return (document.body && document.body.dataset.timeZone) || "UTC";
  }

  function cookie() {
    const match = document.cookie.match(new RegExp(`(?:^|; )${COOKIE}=([^;]*)`));
    return match ? match[1] : "";
  }

  // The wall-clock parts of a moment in a zone, and the zone's offset then (minutes east of UTC).
  function parts(moment, zone) {
    const format = new Intl.DateTimeFormat("en-GB", {
      timeZone: zone,
      hourCycle: "h23",
      year: "numeric",
      month: "2-digit",
      day: "2-digit",
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
    });
    const values = {};
    for (const part of format.formatToParts(moment)) values[part.type] = part.value;
    const wall = Date.UTC(+values.year, +values.month - 1, +values.day, +values.hour, +values.minute, +values.second);
    const offset = Math.round((wall - Math.floor(moment.getTime() / 1000) * 1000) / 60000);
    return { ...values, offset };
  }

  function offsetLabel(minutes) {
    if (!minutes) return "UTC";
    const pad = (n) => String(n).padStart(2, "0");
    const sign = minutes > 0 ? "+" : "-";
    const size = Math.abs(minutes);
    return `UTC${sign}${pad(Math.floor(size / 60))}:${pad(size % 60)}`;
  }

  function zoneOrUtc(zone) {
    try {
      new Intl.DateTimeFormat("en-GB", { timeZone: zone });
      return zone;
    } catch (error) {
      return "UTC";
    }
  }

  // "2026-11-26 20:20 UTC+01:00" for an ISO 8601 time; "" for anything else.
  function format(iso, zone) {
    const moment = new Date(iso);
    if (Number.isNaN(moment.getTime())) return "";
    const local = parts(moment, zoneOrUtc(zone || pageZone()));
    return `${local.year}-${local.month}-${local.day} ${local.hour}:${local.minute} ${offsetLabel(local.offset)}`;
  }

  // Reports the browser's zone. The first time it changes, a page whose times were drawn in another zone (not
  // one the person chose) is drawn again, so that its times are in the reader's zone from the first page on.
  function report() {
    const zone = browserZone();
    // Zone names are letters, digits and "/_+-": written as they are, which the server reads without decoding.
    if (!/^[A-Za-z0-9/_+-]+$/.test(zone) || cookie() === zone) return;
    const secure = window.location.protocol === "https:" ? "; Secure" : "";
    document.cookie = `${COOKIE}=${zone}; Path=/; Max-Age=31536000; SameSite=Lax${secure}`;
    const body = document.body;
    if (cookie() !== zone || !body || body.dataset.timeZoneRedraw !== "true") return;
    if (readsDifferently(pageZone(), zone)) window.location.reload();
  }

  // Whether a moment on the page would read otherwise in `zone` ("UTC" and "Etc/UTC" read alike).
  function readsDifferently(drawnIn, zone) {
    if (drawnIn === zone) return false;
    for (const element of document.querySelectorAll("time[datetime*='T']")) {
      if (format(element.dateTime, drawnIn) !== format(element.dateTime, zone)) return true;
    }
    return false;
  }

  document.addEventListener("DOMContentLoaded", report);

  return { format, browserZone };
})();
