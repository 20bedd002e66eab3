"""slo-api's robustness harness: random traffic and injected faults against the real control
plane, everything recorded, and validators that hold the recording to slo-api's promises.

Not part of the image; see docs/development.md, "The robustness harness".
"""
