"""Prefect tasks: thin wrappers that give library calls retries, cache policies and tags."""

import logging

from prefect.settings import get_current_settings

from esper_core.settings import EsperSettings

# Where Prefect sends esper_core's records to the run's logs (PREFECT_LOGGING_EXTRA_LOGGERS, set
# for deployments in prefect.yaml), they need a level of their own: they would inherit the root
# logger's WARNING, and the INFO lines (device, step engine compiled or eager, Tamiyo's policy)
# would never get there. Elsewhere (the `esper` CLI) the console stays as it was.
if "esper_core" in (get_current_settings().logging.extra_loggers or ()):
    logging.getLogger("esper_core").setLevel(EsperSettings().log_level)
