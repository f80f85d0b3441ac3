/*
 * config/cli.h - `llmserve serve` command-line flags over a struct config,
 * and the --help text. Flags come from config/setting.c's table, plus
 * --config FILE and --help. Both "--flag value" and "--flag=value" work;
 * short flags take the next argument.
 *
 * Private to config/. [before start]
 */
#ifndef LLMSERVE_CONFIG_CLI_H
#define LLMSERVE_CONFIG_CLI_H

#include <stddef.h>
#include <stdio.h>

struct config;

/* Finds --config FILE in argv (argv[0] is the subcommand). *out_path is
 * borrowed from argv, NULL when absent. Returns 0 or ERR_INVAL (flag without
 * its value). */
int cli_find_config(int argc, char **argv, const char **out_path, char *msg, size_t msg_size);

/* Applies every flag of argv to c (--config is skipped: the caller loaded it
 * first; --help sets c->show_help). Returns 0 or ERR_INVAL naming the flag
 * (unknown flag, missing value, bad value, stray argument). */
int cli_parse(struct config *c, int argc, char **argv, char *msg, size_t msg_size);

/* Writes the help text, with each setting's value in defaults (the caller
 * fills them: cli.c calls nothing of config.c, config.c drives cli.c). */
void cli_print_help(FILE *fp, const struct config *defaults);

#endif
