"""Model code (bpy-free): what a family is and the one family job, what adapters share (imaging, contracts, results as files), and the rooms below: adapters, tiles, store, batch."""
