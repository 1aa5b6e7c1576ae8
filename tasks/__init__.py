"""Prefect tasks: thin wrappers that give library calls retries, cache policies and tags."""

import logging

from esper_core.settings import EsperSettings

# Prefect sends the records of esper_core.* to the run's logs (PREFECT_LOGGING_EXTRA_LOGGERS in
# prefect.yaml), but without a level of their own they inherit the root logger's WARNING and the
# INFO lines (device chosen, step engine compiled or eager, Tamiyo's policy) never get there.
logging.getLogger("esper_core").setLevel(EsperSettings().log_level)
