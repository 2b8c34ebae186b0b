// Test driver for kernels/gpuhive/decision.hpp (tests/test_cpp_decision.py).
//
// Reads records from stdin, each a header line "OP LEN\n" and LEN bytes of
// payload, and writes one tab-separated line per record:
//
//   pair      payload: task JSON, a 0x1F byte, decision JSON (bare or explain)
//             -> OK hash verify shards contract canonical | ERR field message
//   task      -> OK task_json | ERR field message
//   decision  -> OK decision_json | ERR field message
//   plan      explain --json output -> OK machine policy hash verify shards
//   decide    a command line for gpuhive::decide -> as plan
//   decide_task  task JSON, machine, policy, program (0x1F between) for
//             gpuhive::decide(task, ...) -> as plan, then explain_command
//   num       a JSON number read as a share -> OK bits(hex) repr | ERR field message
//   repr      doubles as hex bit patterns, space-separated -> their reprs
//   split     "n hex hex ..." -> OK b-e,b-e,... | ERR field message
//
// verify, shards and contract are "ok"/the shards, or "ERR field|message".

#include "../../kernels/gpuhive/decision.hpp"

#include <cinttypes>
#include <iostream>
#include <iterator>
#include <sstream>

namespace {

std::string err(const gpuhive::ContractError& e) { return "ERR " + e.field() + "|" + e.problem(); }

std::string hex_bits(double x) {
    std::uint64_t b;
    std::memcpy(&b, &x, sizeof b);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, b);
    return buf;
}

double from_bits(const std::string& h) {
    std::uint64_t b = std::stoull(h, nullptr, 16);
    double x;
    std::memcpy(&x, &b, sizeof x);
    return x;
}

std::string shard_text(const gpuhive::Task& t, const gpuhive::Decision& d) {
    try {
        std::string out;
        for (const auto& s : gpuhive::shards(t, d))
            out += (out.empty() ? "" : ",") + std::to_string(s.device) + ":" +
                   std::to_string(s.begin) + ":" + std::to_string(s.end);
        return out;
    } catch (const gpuhive::ContractError& e) {
        return err(e);
    }
}

std::string verify_text(const gpuhive::Task& t, const gpuhive::Decision& d) {
    try {
        gpuhive::verify(t, d);
        return "ok";
    } catch (const gpuhive::ContractError& e) {
        return err(e);
    }
}

std::string contract_text(const gpuhive::Decision& d) {
    try {
        gpuhive::check_contract(d);
        return "ok";
    } catch (const gpuhive::ContractError& e) {
        return err(e);
    }
}

std::string plan_text(const gpuhive::Plan& p) {
    return p.machine + "\t" + p.policy + "\t" + gpuhive::config_hash(p.task, p.decision) + "\t" +
           verify_text(p.task, p.decision) + "\t" + shard_text(p.task, p.decision);
}

std::string run(const std::string& op, const std::string& payload) {
    if (op == "pair") {
        std::size_t cut = payload.find('\x1f');
        gpuhive::Task t = gpuhive::parse_task(std::string_view(payload).substr(0, cut));
        gpuhive::Decision d = gpuhive::parse_decision(std::string_view(payload).substr(cut + 1));
        return gpuhive::config_hash(t, d) + "\t" + verify_text(t, d) + "\t" + shard_text(t, d) +
               "\t" + contract_text(d) + "\t" + gpuhive::canonical_json(t, d);
    }
    if (op == "task") return gpuhive::task_json(gpuhive::parse_task(payload));
    if (op == "decision") return gpuhive::decision_json(gpuhive::parse_decision(payload));
    if (op == "plan") return plan_text(gpuhive::parse_plan(payload));
    if (op == "decide") return plan_text(gpuhive::decide(payload));
    if (op == "decide_task") {
        std::vector<std::string> parts;
        std::size_t start = 0, cut;
        while ((cut = payload.find('\x1f', start)) != std::string::npos) {
            parts.push_back(payload.substr(start, cut - start));
            start = cut + 1;
        }
        parts.push_back(payload.substr(start));
        gpuhive::Task t = gpuhive::parse_task(parts.at(0));
        return plan_text(gpuhive::decide(t, parts.at(1), parts.at(2), parts.at(3))) + "\t" +
               gpuhive::explain_command(t, parts.at(1), parts.at(2), parts.at(3));
    }
    if (op == "num") {
        double x = gpuhive::detail::expect_number(gpuhive::detail::parse_json(payload), "share");
        return hex_bits(x) + "\t" + gpuhive::detail::py_float_repr(x);
    }
    if (op == "repr") {
        std::istringstream in(payload);
        std::string h, out;
        while (in >> h) out += (out.empty() ? "" : " ") + gpuhive::detail::py_float_repr(from_bits(h));
        return out;
    }
    if (op == "split") {
        std::istringstream in(payload);
        long long n;
        in >> n;
        std::vector<double> shares;
        std::string h;
        while (in >> h) shares.push_back(from_bits(h));
        std::string out;
        for (const auto& [lo, hi] : gpuhive::split_rows(n, shares))
            out += (out.empty() ? "" : ",") + std::to_string(lo) + "-" + std::to_string(hi);
        return out;
    }
    throw std::runtime_error("unknown op " + op);
}

}  // namespace

int main() {
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::size_t pos = 0;
    while (pos < input.size()) {
        std::size_t nl = input.find('\n', pos);
        std::istringstream header(input.substr(pos, nl - pos));
        std::string op;
        std::size_t len = 0;
        header >> op >> len;
        std::string payload = input.substr(nl + 1, len);
        pos = nl + 1 + len;
        try {
            std::string result = run(op, payload);  // before anything is printed
            std::cout << "OK\t" << result << "\n";
        } catch (const gpuhive::ContractError& e) {
            std::cout << "ERR\t" << e.field() << "\t" << e.problem() << "\n";
        }
    }
    return 0;
}
