#!/bin/bash
# GCE runs this when the VM stops, including on Spot preemption (about 30 s of notice). Stopping the unit
# sends SIGTERM (KillSignal=SIGTERM): the actor hands its leases back and deregisters.
systemctl stop aurora-actor.service
