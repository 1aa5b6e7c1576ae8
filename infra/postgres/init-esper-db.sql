-- A second database for Urza next to Prefect's own (POSTGRES_DB); same owner.
CREATE DATABASE esper OWNER prefect;
