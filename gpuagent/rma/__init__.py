"""The RMA packet of one board: ``gpuagent rma`` (:mod:`gpuagent.commands.rmacli`)."""
