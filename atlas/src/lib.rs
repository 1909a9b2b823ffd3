//! nightshift-atlas: the atlas trace format, routing statistics, the placement planner and plots.
