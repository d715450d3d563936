"""Reports: Table 2a/2b breakdowns, plots, a plain-language statement, rendered to HTML/MD/JSON/LaTeX/CSV."""
from dpledger.reports.render import FORMATS, render
from dpledger.reports.run_data import RunData, load_run

__all__ = ["FORMATS", "RunData", "load_run", "render"]
