"""The window status page in the Airflow UI: an Airflow plugin (plugin.py)
serving a FastAPI app (app.py) that reads every pipeline's windows and offsets
from the ledger (status.py) and renders them (page.py)."""
