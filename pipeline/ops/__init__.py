"""Operations: how bertflow runs on a machine, apart from what it computes. The project lock and
its watchdog, the own Prefect server and its UI, the schedule, SIGTERM and SIGINT (a stage ended
as a failure, a server stopped), the process environment, secret masking on the consoles, and the
model server's request-size limit. Nothing under components/ imports it; pipeline's flow, stages
and CLI use it."""
