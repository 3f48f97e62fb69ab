"""The planner's per-rank layer: a rank's layer costs, its data-parallel cost object, its stage
timeline (RankModel) and once-per-step tail; reads the method and cost layers."""
