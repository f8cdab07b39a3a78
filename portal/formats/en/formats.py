"""The portal's own English formats, over Django's 12-hour "N j, Y, P": ISO-like dates and 24-hour times with the
zone, so that a date or time written without a format of its own reads like the rest (frontend.time_zones)."""

DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i"
DATETIME_FORMAT = "Y-m-d H:i T"  # "2026-11-26 20:20 CET": Django has no "UTC+01:00" format character
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
MONTH_DAY_FORMAT = "F j"
YEAR_MONTH_FORMAT = "F Y"
