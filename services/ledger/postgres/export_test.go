package postgres

// UpdateBalancesSQL exposes the balance compare-and-set to tests.
const UpdateBalancesSQL = updateBalancesSQL

// AdvanceTransfersSQL exposes the transfer compare-and-set to tests.
const AdvanceTransfersSQL = advanceTransfersSQL

// MaxIDTries exposes the bound on the IDs minted for one account.
const MaxIDTries = maxIDTries
