"""The planner's cost layer: what one layer, one collective, one pipeline schedule and one optimizer
step cost, and the bytes they hold; reads only the inputs layer (meshplan.planner.context)."""
