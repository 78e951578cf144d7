"""Everything multitask: data, schedules, model heads, objectives, training and evaluation."""
