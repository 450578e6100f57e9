"""What is trained and on what, as plain frozen dataclasses: model, hardware, layout, job, and the rules
a layout must follow (validate: the planner's; capabilities: what plait train runs). Never imports torch."""
