package postgres

// UpdateBalancesSQL exposes the balance compare-and-set to tests.
const UpdateBalancesSQL = updateBalancesSQL
