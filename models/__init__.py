"""Model code (bpy-free): what a family is and the one family job, what adapters share (imaging, contracts, results as files), and the rooms below: adapters, tiles, store, batch."""

# The registry fills the family check's order (models/family.py IDENTIFY_ORDER) when it loads: loaded
# with the package, every job's file is checked against every family, whichever module runs the job.
from . import families  # noqa: E402, F401
