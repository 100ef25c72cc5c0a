package postgres

// UpdateBalancesSQL exposes the balance compare-and-set to tests.
const UpdateBalancesSQL = updateBalancesSQL

// AdvanceTransfersSQL exposes the transfer compare-and-set to tests.
const AdvanceTransfersSQL = advanceTransfersSQL

// MaxIDTries exposes the bound on the IDs minted for one account.
const MaxIDTries = maxIDTries

// StatementSQL exposes the statements check's query, for a schema older
// than the whole of verify's.
const StatementSQL = statementSQL
