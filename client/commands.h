// prefixctl's commands. Each returns the process exit code: 0 on success, 1 when the call
// failed (the message goes to `err`).
#ifndef PREFIXD_CLIENT_COMMANDS_H_
#define PREFIXD_CLIENT_COMMANDS_H_

#include <ostream>

#include "client/cli_args.h"
#include "client/connection.h"

namespace prefixd {

int RunGenerate(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err);
int RunTokenize(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err);
int RunInfo(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err);
int RunStats(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err);
// What `stats` prints for `s`: one JSON object, or lines for a person (the disk tier's two
// only when the server has one).
void PrintCacheStats(const v1::CacheStats& s, bool json, std::ostream& out);
// grpc.health.v1 Check of the whole server: prints the status; 0 only when SERVING (the
// container's HEALTHCHECK and scripts use the exit code).
int RunHealth(Connection& conn, std::ostream& out, std::ostream& err);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_COMMANDS_H_
