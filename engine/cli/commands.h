// commands.h — one entry per CLI command; each takes the arguments after its name and returns
// the process exit code (0 ok, 1 data error or failed run, 2 usage).
#pragma once
int cmd_run(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_receipt(int argc, char **argv);
int cmd_gate(int argc, char **argv);
