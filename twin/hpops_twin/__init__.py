"""The local twin: the real state machine and handlers from template.yaml, run on a laptop.

  template_model.py   reads template.yaml (the single source of truth) and resolves intrinsics
  hyperpod_sim.py     a HyperPod simulator on top of moto's SageMaker backend (IPs, replacement,
                      scaling, the documented event shapes)
  lambda_dispatch.py  runs Lambda tasks in-process with the real handlers (moto needs Docker)
  world.py            provisions the template's resources in moto and routes events like EventBridge
  ssm_sessions.py     Session Manager (StartSession/DescribeSessions/TerminateSession, which moto
                      lacks) and users who open sessions; session_demo.py / session_bench.py use it
  demo_story.py       `make demo`'s chapters in order (demo.py: the steps; bench.py: `make bench`)
  commands.py         the twin behind `hpops demo`, `twin send`, `bench` and `--twin` (the CLI is cli/hpops)
"""
