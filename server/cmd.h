/*
 * cmd.h - declares the cmd_* subcommand entry points. Each takes the
 * subcommand's own argv (argv[0] is the subcommand name) and returns the
 * process exit status.
 */
#ifndef LLMSERVE_CMD_H
#define LLMSERVE_CMD_H

int cmd_generate(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_quantize(int argc, char **argv);    // server/cmd_quant.c
int cmd_perplexity(int argc, char **argv);  // server/cmd_quant.c

#endif
